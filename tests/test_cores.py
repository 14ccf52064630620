"""The cores a process may use (transformer/cores.py): its affinity capped by its cgroup's CPU limit,
read from fake /proc/self and cgroup trees of each layout the kernel and container runtimes make,
and, where this machine lets a test make a cgroup, from the kernel's own files."""
import contextlib
import os
import subprocess
import sys
import tempfile
import uuid

import pytest

import transformer as T
from transformer import cgroups, cores

from conftest import SINGLE_THREADED


def fake(tmp_path, cgroup, mounts, files):
    """A /proc/self with `cgroup` and `mountinfo` lines (mount points relative to tmp_path, written
    as the kernel escapes them), and the cgroup files {relative path: content}."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("".join(line + "\n" for line in cgroup))
    lines = []
    for i, (fstype, root, point, options) in enumerate(mounts):
        where = str(tmp_path / point).replace(" ", "\\040")
        lines.append(f"{30 + i} 1 0:{40 + i} {root} {where} rw,nosuid shared:{i} - {fstype} {fstype} {options}")
    lines.append("22 1 0:21 / /proc rw,nosuid - proc proc rw")   # not a cgroup mount
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return str(proc)


V2 = ("cgroup2", "/", "sys/fs/cgroup", "rw,nsdelegate")


def test_a_container_with_its_own_cgroup_namespace_reads_cpu_max_at_the_mount(tmp_path):
    proc = fake(tmp_path, ["0::/"], [V2], {"sys/fs/cgroup/cpu.max": "150000 100000\n"})
    assert cores.cpu_limit(proc) == 1.5


def test_no_limit_is_none(tmp_path):
    proc = fake(tmp_path, ["0::/"], [V2], {"sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert cores.cpu_limit(proc) is None


def test_the_tightest_limit_up_the_hierarchy_counts(tmp_path):
    """systemd: a service's scope inside a slice; the slice's CPUQuota binds the scope too."""
    files = {"sys/fs/cgroup/a.slice/cpu.max": "200000 100000", "sys/fs/cgroup/a.slice/b.scope/cpu.max": "max 100000",
             "sys/fs/cgroup/cpu.max": "not read past the mount"}
    proc = fake(tmp_path, ["0::/a.slice/b.scope"], [V2], files)
    assert cores.cpu_limit(proc) == 2.0
    (tmp_path / "sys/fs/cgroup/a.slice/b.scope/cpu.max").write_text("50000 100000")
    assert cores.cpu_limit(proc) == 0.5
    (tmp_path / "sys/fs/cgroup/a.slice/cpu.max").write_text("max 100000")
    (tmp_path / "sys/fs/cgroup/a.slice/b.scope/cpu.max").write_text("max 100000")
    assert cores.cpu_limit(proc) is None


def test_cgroup_v1_without_a_namespace_reads_the_mounted_root(tmp_path):
    """Docker on cgroup v1: /proc/self/cgroup names the host's path, the container mounts its own
    cgroup as the root of the hierarchy."""
    mounts = [("cgroup", "/docker/abc", "sys/fs/cgroup/cpu,cpuacct", "rw,cpu,cpuacct"),
              ("cgroup", "/docker/abc", "sys/fs/cgroup/memory", "rw,memory")]
    files = {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "250000\n",
             "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    proc = fake(tmp_path, ["5:memory:/docker/abc", "4:cpu,cpuacct:/docker/abc", "0::/"], mounts, files)
    assert cores.cpu_limit(proc) == 2.5
    (tmp_path / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cpu_limit(proc) is None


def test_hybrid_hierarchies_take_the_cpu_controller_where_it_is(tmp_path):
    """cgroup v1 for the controllers and an empty v2 hierarchy beside them (systemd's hybrid)."""
    mounts = [("cgroup", "/", "cg/cpu", "rw,cpu"), ("cgroup", "/", "cg/cpuacct", "rw,cpuacct"),
              ("cgroup2", "/", "cg/unified", "rw")]
    files = {"cg/cpu/job/cpu.cfs_quota_us": "100000", "cg/cpu/job/cpu.cfs_period_us": "100000",
             "cg/cpuacct/job/cpu.cfs_quota_us": "1000", "cg/cpuacct/job/cpu.cfs_period_us": "100000",
             "cg/unified/job/cgroup.procs": ""}
    proc = fake(tmp_path, ["2:cpuacct:/job", "1:cpu:/job", "0::/job"], mounts, files)
    assert cores.cpu_limit(proc) == 1.0      # not cpuacct's files, which are no limit of its


def test_a_mount_point_with_a_space_and_a_path_outside_the_mount(tmp_path):
    mounts = [("cgroup2", "/", "my cgroups", "rw")]
    proc = fake(tmp_path, ["0::/../../elsewhere"], mounts, {"my cgroups/cpu.max": "300000 100000"})
    assert cores.cpu_limit(proc) == 3.0
    proc2 = tmp_path / "two"
    proc2.mkdir()
    proc = fake(proc2, ["0::/not/under/the/root"], [("cgroup2", "/kubepods/pod1", "cg", "rw")],
                {"cg/cpu.max": "120000 100000"})
    assert cores.cpu_limit(proc) == 1.2


@pytest.mark.parametrize("content", ["", "abc 100000", "100000 0", "-5 100000", "100000 x", "\x00\xff"])
def test_an_unreadable_limit_is_no_limit(tmp_path, content):
    proc = fake(tmp_path, ["0::/"], [V2], {"sys/fs/cgroup/cpu.max": content})
    assert cores.cpu_limit(proc) is None


def test_missing_files_and_odd_lines_are_no_limit(tmp_path):
    assert cores.cpu_limit(str(tmp_path / "nowhere")) is None
    proc = fake(tmp_path, ["garbage", "0::/"], [V2], {})     # no cpu.max: the root of a hierarchy
    assert cores.cpu_limit(proc) is None
    (tmp_path / "proc" / "mountinfo").write_text("short line\n1 2 3 - 4\n")
    assert cores.cpu_limit(proc) is None


@pytest.mark.parametrize("limit,threads", [(None, None), (0.05, 1), (1.0, 1), (1.2, 2), (1.5, 2), (2.0, 2),
                                           (15.9, 16)])
def test_the_limit_is_rounded_up_to_threads(limit, threads):
    """Rounded up: on 2 Zen 4 cores, real tiny runs with two threads were 1.31x faster than with
    one under 1.5 CPUs and 1.10x under 1.2; under 1.0 one thread was 1.21x faster than two."""
    assert cores.limit_cores(limit) == threads


def test_usable_cores_and_their_description(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cores", lambda: 8)
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: None)
    assert cores.usable_cores() == 8
    assert cores.describe(8) == "the 8 cores this process may run on"
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: 1.5)
    assert cores.usable_cores() == 2
    assert cores.describe(2) == "the 2 cores this process may use (its cgroup's CPU limit is 1.5 CPUs)"
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: 12.0)
    assert cores.usable_cores() == 8                  # the affinity binds
    assert cores.describe(8) == "the 8 cores this process may run on"


def test_the_default_thread_count_is_capped_by_the_limit(monkeypatch, restore_threads):
    """What import does without OMP_NUM_THREADS; with it, the variable is honoured as given."""
    if SINGLE_THREADED:
        pytest.skip("a build without OpenMP runs one thread whatever the limit")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    T.set_num_threads(4)
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: 1.5)
    T._init_from_environment()
    assert T.get_num_threads() == 2
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: None)
    T.set_num_threads(3)
    T._init_from_environment()
    assert T.get_num_threads() == 3
    monkeypatch.setattr(cores, "cpu_limit", lambda proc=None: 1.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    T._init_from_environment()
    assert T.get_num_threads() == 3
    assert T.build_info()["cpu_limit"] == 1.0


def writable_v1(controller):
    """Where this machine lets root make a cgroup v1 group of `controller`, its mount point; else None."""
    try:
        for fstype, root, point, options in cgroups.cgroup_mounts():
            if fstype == "cgroup" and controller in options and root == "/" and os.access(point, os.W_OK):
                return point
    except OSError:
        pass
    return None


@contextlib.contextmanager
def v1_group(controller, files):
    """A new cgroup v1 group of `controller` with its limit `files` written ({name: content}), removed
    after; yields the Python statement that moves the process running it into the group."""
    group = os.path.join(writable_v1(controller), f"transformer-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(group)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc}")
    try:
        for name, content in files.items():
            with open(os.path.join(group, name), "w") as f:
                f.write(content)
        yield f"import os; open({os.path.join(group, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))"
    finally:
        os.rmdir(group)


@pytest.mark.skipif(writable_v1("cpu") is None, reason="no writable cgroup v1 cpu hierarchy (needs root)")
@pytest.mark.skipif(SINGLE_THREADED, reason="a build without OpenMP runs one thread whatever the limit")
def test_a_real_cgroup_limit_sets_the_default_at_import():
    """The kernel's own files: a process moved into a cgroup with a 1-CPU quota imports the engine
    with one thread, and reads the limit it was given."""
    with v1_group("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}) as enter:
        code = (enter + "; import transformer as T; from transformer import cores; "
                "print(T.get_num_threads(), cores.cpu_limit(), T.build_info()['cpu_limit'])")
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                              cwd=tempfile.gettempdir())
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["1", "1.0", "1.0"]
