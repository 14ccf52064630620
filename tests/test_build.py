"""The build, the SIMD dispatch and the one thread count of the process."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

import transformer as T
from transformer import _C

from conftest import SINGLE_THREADED, needs_threads, num_threads


def run_python(code, **env):
    """Run `code` in a fresh interpreter (import-time behaviour) and return its stdout."""
    full_env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "TRANSFORMER_ISA"):
        full_env.pop(key, None)
    full_env.update(env)
    # From outside the checkout: its transformer/ folder has no compiled module to import.
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=120, cwd=tempfile.gettempdir())
    return proc


def test_build_info_reports_compiler_openmp_isa_and_threads():
    info = T.build_info()
    print(info)
    assert info["compiler"].split()[0] in ("gcc", "clang")
    # A single-threaded build is tested on purpose only (.ci/no-openmp says so); anywhere else,
    # OpenMP missing is a broken build, not a skip.
    if os.environ.get("TRANSFORMER_TEST_SINGLE_THREADED") == "1":
        assert info["openmp"] == 0 and info["threads"] == 1, info
        assert info["threading"].startswith("single-threaded: ") and "OpenMP" in info["threading"]
    else:
        assert info["openmp"] >= 201107, "built without OpenMP"
        assert info["threading"] == "OpenMP"
    assert info["isa"] in _C.isa_levels()
    assert info["threads"] == T.get_num_threads()
    assert info["bf16"].startswith(info["isa"] + " ")
    assert info["int8"].split()[0] == {"generic": "generic", "neon": "neon", "neon_dotprod": "neon_dotprod",
                                       "avx2": "avx2", "avx512": "avx2",
                                       "avx512_vnni": "avx512_vnni",
                                       "avx512_bf16": "avx512_vnni", "amx": "amx"}[info["isa"]]


def test_build_info_names_the_reduced_precision_paths_of_the_forced_level():
    proc = run_python("import transformer as T; i = T.build_info(); print(i['bf16'], '|', i['int8'])",
                      TRANSFORMER_ISA="generic")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "generic (bf16-rounded operands, fp32 FMA) | generic (C, int32)"


def test_set_num_threads_changes_the_team_size():
    before = T.get_num_threads()
    try:
        T.set_num_threads(1)
        assert T.get_num_threads() == 1
        assert _C.probe_team() == 1
        T.set_num_threads(2)
        assert T.get_num_threads() == 2
        assert _C.probe_team() == 2
    finally:
        T.set_num_threads(before)


def lanes_seen(lanes, threads):
    import threading
    seen, lock = [], threading.Lock()

    def lane(l):
        with lock:
            seen.append((l, threading.get_ident(), T.get_num_threads()))

    with num_threads(threads):
        _C.run_lanes(lanes, lane)
    return seen


@needs_threads
def test_run_lanes_runs_each_lane_once_on_a_thread_of_its_own():
    """Two lanes on two threads: lane 0 on the calling thread, lane 1 on another (the team's)."""
    import threading
    seen = lanes_seen(2, 2)
    assert sorted(l for l, _, _ in seen) == [0, 1]
    by_lane = {l: ident for l, ident, _ in seen}
    assert by_lane[0] == threading.get_ident() and by_lane[1] != by_lane[0]


def test_run_lanes_runs_more_lanes_than_threads_in_turn():
    seen = lanes_seen(5, 1)
    assert [l for l, _, _ in seen] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=needs_threads)])
def test_run_lanes_raises_a_lanes_error_after_every_lane_has_ended(threads):
    ended = []

    def lane(l):
        if l == 1:
            raise KeyError("lane 1 failed")
        ended.append(l)

    with num_threads(threads), pytest.raises(KeyError, match="lane 1 failed"):
        _C.run_lanes(3, lane)
    assert sorted(ended) == [0, 2]
    with pytest.raises(ValueError, match="lanes"):
        _C.run_lanes(0, lambda l: None)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                        ("2", TypeError), (True, TypeError), (None, TypeError)])
def test_set_num_threads_rejects_bad_values(bad, error):
    with pytest.raises(error, match="n must"):
        T.set_num_threads(bad)


@pytest.mark.parametrize("threads", ["1", pytest.param("2", marks=needs_threads)])
def test_omp_num_threads_is_honoured_at_import(threads):
    proc = run_python("import transformer as T, transformer._C as C; print(T.get_num_threads(), C.probe_team())",
                      OMP_NUM_THREADS=threads)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [threads, threads]


def test_isa_can_be_forced_lower_by_environment():
    proc = run_python("import transformer as T; print(T.build_info()['isa'])", TRANSFORMER_ISA="generic")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "generic"


def test_bad_isa_environment_names_the_variable():
    proc = run_python("import transformer", TRANSFORMER_ISA="sse9")
    assert proc.returncode != 0
    assert "TRANSFORMER_ISA" in proc.stderr


def test_set_isa_clamps_to_what_the_cpu_has():
    best = _C.best_isa()
    try:
        assert _C.set_isa("generic") == "generic"
        assert _C.set_isa(_C.isa_levels()[-1]) == best
    finally:
        _C.set_isa(best)
    with pytest.raises(ValueError, match="isa"):
        _C.set_isa("sse9")


def test_the_levels_are_those_of_the_architecture():
    import platform
    levels = _C.isa_levels()
    if platform.machine() in ("aarch64", "arm64"):
        assert levels == ["generic", "neon", "neon_dotprod"]
    else:
        assert levels == ["generic", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"]


@pytest.mark.skipif(not SINGLE_THREADED, reason="the refusal of a build without OpenMP")
def test_single_threaded_build_refuses_more_threads_naming_the_fix():
    with pytest.raises(T.SingleThreadedBuild, match="without OpenMP.*docs/platforms.md"):
        T.set_num_threads(2)
    T.set_num_threads(1)
    assert T.get_num_threads() == 1 and _C.probe_team() == 1


@pytest.mark.skipif(not SINGLE_THREADED, reason="the refusal of a build without OpenMP")
def test_single_threaded_build_ignores_omp_num_threads_and_cli_refuses_threads_in_one_line():
    proc = run_python("import transformer as T; print(T.get_num_threads())", OMP_NUM_THREADS="4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"
    proc = run_python("import sys; from transformer.cli import main; "
                      "sys.argv = ['transformer', 'translate', '--model', 'nowhere', '--threads', '2', 'x']; sys.exit(main())")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr   # one line
    assert "--threads 2" in proc.stderr and "without OpenMP" in proc.stderr


@pytest.mark.skipif(not SINGLE_THREADED, reason="the refusal of a build without OpenMP")
def test_single_threaded_build_refuses_a_bench_grid_with_more_threads_before_it_runs():
    """`bench --threads 1,2` ran its first point, then stopped at the second with a traceback."""
    proc = run_python("import sys; from transformer.cli import main; sys.argv = "
                      "['transformer', 'bench', '--what', 'masking', '--threads', '1,2']; sys.exit(main())")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr   # one line
    assert "--threads 1,2: 2 threads refused" in proc.stderr and "without OpenMP" in proc.stderr
    assert proc.stdout == ""                                                         # nothing measured


TORCH_PROBE = """
import json, numpy as np
{first}
{second}
T.set_num_threads(2)
rng = np.random.default_rng(0)
a = rng.standard_normal((300, 200), dtype=np.float32)
b = rng.standard_normal((200, 100), dtype=np.float32)
before = T.ops.matmul(a, b)
torch.set_num_threads(1)
x = torch.randn(256, 256); (x @ x).sum()
result = {{"ours": T.get_num_threads(), "team": T._C.probe_team(), "torch": torch.get_num_threads(),
           "same": bool(np.array_equal(before, T.ops.matmul(a, b)))}}
T.set_num_threads(1)
result["torch_after"] = torch.get_num_threads()
result["team1"] = T._C.probe_team()
print(json.dumps(result))
"""


@needs_threads
@pytest.mark.parametrize("order", ["transformer_first", "torch_first"])
def test_importing_torch_does_not_change_or_oversubscribe_our_threads(order):
    pytest.importorskip("torch")
    first, second = "import transformer as T", "import torch"
    if order == "torch_first":
        first, second = second, first
    proc = run_python(TORCH_PROBE.format(first=first, second=second), OMP_NUM_THREADS="2")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    # torch's thread count and ours are independent settings; each keeps its own.
    assert result == {"ours": 2, "team": 2, "torch": 1, "same": True, "torch_after": 1, "team1": 1}


def test_every_subpackage_is_installed():
    """pip installs only the packages pyproject.toml lists: a subpackage missing there works in
    the source tree and is absent for users (transformer.bench once was)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not a source checkout")
    listed = set(re.findall(r'"(transformer(?:\.[a-z_]+)*)"', re.search(r"^packages = \[(.*)\]",
                                                                        pyproject.read_text(), re.M)[1]))
    present = {".".join(p.parent.relative_to(root).parts) for p in (root / "transformer").rglob("__init__.py")}
    assert present <= listed, f"not in pyproject's packages: {sorted(present - listed)}"


def test_everything_the_readmes_test_command_installs_is_here():
    """The tests that need torch or a package of the test and mpi extras skip without it, so a
    requirement missing from this environment would hide them all (CTranslate2's did, issue 48):
    the README's command installs torch and ".[test,mpi]", and this test names what is missing."""
    import importlib.metadata
    import pathlib

    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:                      # Python < 3.11
        pytest.skip("reads pyproject.toml with tomllib (Python 3.11+)")
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not a source checkout")
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    wanted = [Requirement("torch")] + [Requirement(r) for r in extras["test"] + extras["mpi"]]
    missing = []
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{requirement} (found {version})")
    assert not missing, f'not installed (pip install torch==2.13.0 ".[test,mpi]"): {missing}'
