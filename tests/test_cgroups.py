"""The memory a process may fill (transformer/cgroups.py): the machine's, capped by its cgroups'
memory limit, read from fake /proc/self and cgroup trees of each layout, and, where this machine
lets a test make a cgroup, from the kernel's own files; and the decoding check that refuses a
request past it. (The CPU limit's layouts: test_cores.py.)"""
import subprocess
import sys
import tempfile

import pytest

from transformer import cgroups
from transformer.decoding import checks

from test_cores import V2, fake, v1_group, writable_v1

GIB = 1 << 30


def test_a_container_with_its_own_cgroup_namespace_reads_memory_max_at_the_mount(tmp_path):
    proc = fake(tmp_path, ["0::/"], [V2], {"sys/fs/cgroup/memory.max": "2147483648\n"})
    assert cgroups.memory_limit(proc) == 2 * GIB
    (tmp_path / "sys/fs/cgroup/memory.max").write_text("max\n")
    assert cgroups.memory_limit(proc) is None


def test_the_tightest_memory_limit_up_the_hierarchy_counts(tmp_path):
    """systemd: a scope inside a slice whose MemoryMax binds the scope too."""
    files = {"sys/fs/cgroup/a.slice/memory.max": str(3 * GIB), "sys/fs/cgroup/a.slice/b.scope/memory.max": "max",
             "sys/fs/memory.max": "1"}              # above the mount point: not read
    proc = fake(tmp_path, ["0::/a.slice/b.scope"], [V2], files)
    assert cgroups.memory_limit(proc) == 3 * GIB
    (tmp_path / "sys/fs/cgroup/a.slice/b.scope/memory.max").write_text(str(GIB))
    assert cgroups.memory_limit(proc) == GIB


def test_cgroup_v1_reads_the_memory_controllers_hierarchy(tmp_path):
    """Docker on cgroup v1 without a namespace: the memory hierarchy's root is the container's
    group; the cpu hierarchy's files are no memory limit, and v1's "unlimited" is none."""
    mounts = [("cgroup", "/docker/abc", "cg/cpu,cpuacct", "rw,cpu,cpuacct"),
              ("cgroup", "/docker/abc", "cg/memory", "rw,memory")]
    files = {"cg/memory/memory.limit_in_bytes": str(512 << 20),
             "cg/cpu,cpuacct/memory.limit_in_bytes": "4096"}
    proc = fake(tmp_path, ["5:memory:/docker/abc", "4:cpu,cpuacct:/docker/abc", "0::/"], mounts, files)
    assert cgroups.memory_limit(proc) == 512 << 20
    (tmp_path / "cg/memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroups.memory_limit(proc) is None


def test_the_cpu_and_memory_limits_are_read_each_from_its_own_controller(tmp_path):
    mounts = [("cgroup", "/", "cg/cpu", "rw,cpu"), ("cgroup", "/", "cg/memory", "rw,memory")]
    files = {"cg/cpu/a/cpu.cfs_quota_us": "150000", "cg/cpu/a/cpu.cfs_period_us": "100000",
             "cg/memory/b/memory.limit_in_bytes": str(GIB), "cg/memory/a/memory.limit_in_bytes": "4096"}
    proc = fake(tmp_path, ["2:memory:/b", "1:cpu:/a", "0::/"], mounts, files)
    assert (cgroups.cpu_limit(proc), cgroups.memory_limit(proc)) == (1.5, GIB)


@pytest.mark.parametrize("content", ["", "abc", "-1", "0", "1.5e9", "\x00\xff"])
def test_an_unreadable_memory_limit_is_no_limit(tmp_path, content):
    proc = fake(tmp_path, ["0::/"], [V2], {"sys/fs/cgroup/memory.max": content})
    assert cgroups.memory_limit(proc) is None
    assert cgroups.memory_limit(str(tmp_path / "nowhere")) is None


def test_usable_memory_is_the_tighter_of_the_machine_and_the_limit(monkeypatch):
    monkeypatch.setattr(cgroups, "physical_memory", lambda: 16 * GIB)
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: 2 * GIB)
    assert cgroups.usable_memory() == (2 * GIB, "cgroup")
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: 64 * GIB)
    assert cgroups.usable_memory() == (16 * GIB, "machine")
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: None)
    assert cgroups.usable_memory() == (16 * GIB, "machine")
    monkeypatch.setattr(cgroups, "physical_memory", lambda: None)
    assert cgroups.usable_memory() == (None, None)
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: GIB)
    assert cgroups.usable_memory() == (GIB, "cgroup")


def _cfg():
    import transformer as T
    return T.ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=2, d_ff=64,
                         n_encoder_layers=1, n_decoder_layers=1, max_len=64)


def test_decoding_past_the_cgroups_limit_is_refused_naming_it(monkeypatch):
    """A request that fits the machine but not the container's limit: refused before any decoding,
    where the kernel would kill the process at the limit."""
    cfg = _cfg()
    rows = 100_000                          # about 1.9 GiB of caches at 64 steps
    monkeypatch.setattr(cgroups, "physical_memory", lambda: 16 * GIB)
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: None)
    checks._check_memory(cfg, rows, 64, "beam_size 100000")          # fits the machine
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: GIB)
    with pytest.raises(MemoryError, match=r"^beam_size 100000: 100,000 decoder rows of up to 64 steps need "
                                          r"1\.\d GiB for their caches, more than the 1\.0 GiB its cgroup's "
                                          r"memory limit allows$"):
        checks._check_memory(cfg, rows, 64, "beam_size 100000")
    monkeypatch.setattr(cgroups, "memory_limit", lambda proc=None: None)
    monkeypatch.setattr(cgroups, "physical_memory", lambda: GIB)
    with pytest.raises(MemoryError, match=r"more than this machine's 1\.0 GiB$"):
        checks._check_memory(cfg, rows, 64, "beam_size 100000")


@pytest.mark.skipif(writable_v1("memory") is None, reason="no writable cgroup v1 memory hierarchy (needs root)")
def test_a_real_cgroup_memory_limit_refuses_a_beam_the_machine_would_take():
    """The kernel's own files: a process moved into a cgroup with a 1 GiB limit reads it (so does
    build_info), and a beam whose caches need about 1.8 GiB, less than this machine has, is refused
    naming the limit."""
    total = cgroups.physical_memory()
    if total is None or total < 4 * GIB:
        pytest.skip("the beam must fit this machine's memory for the test to tell the limit from it")
    with v1_group("memory", {"memory.limit_in_bytes": str(GIB)}) as enter:
        code = (enter + "; import numpy as np, transformer as T; from transformer import cgroups; "
                "print(cgroups.memory_limit(), cgroups.usable_memory()[1], T.build_info()['memory_limit']); "
                "m = T.Seq2SeqTransformer(T.ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=32, "
                "n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1, max_len=64), seed=0)\n"
                "try:\n    m.beam_search(np.array([[5, 6, 7, 2]]), beam_size=100000, max_len=63)\n"
                "except MemoryError as e:\n    print(e)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=tempfile.gettempdir())
        assert proc.returncode == 0, proc.stderr
        first, second = proc.stdout.strip().splitlines()
        assert first == f"{GIB} cgroup {GIB}"
        assert second.startswith("beam_size 100000 for 1 sentence: 100,000 decoder rows"), second
        assert second.endswith("more than the 1.0 GiB its cgroup's memory limit allows"), second
