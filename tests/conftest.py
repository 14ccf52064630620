"""Fixtures every kernel test shares: each SIMD level this CPU has, and the thread count."""
import contextlib

import pytest

from transformer import _C

_LEVELS = tuple(_C.isa_levels())
# Every level this CPU supports (the GEMMs have kernels of their own at avx512_vnni: int8, and
# avx512_bf16: bf16) ...
ALL_ISA_LEVELS = list(_LEVELS[: _LEVELS.index(_C.best_isa()) + 1])
# ... and the levels with code of their own in every other kernel (above avx512 they run
# avx512's; on ARM64 neon runs avx2's code through SIMDe): a test of those runs once per distinct
# path.
ISA_LEVELS = [level for level in ALL_ISA_LEVELS if level in ("generic", "avx2", "avx512", "neon")]


def isa_fixture(levels):
    """A fixture running the test once per level of `levels`, then restoring the best level."""
    @pytest.fixture(params=levels)
    def isa(request):
        assert _C.set_isa(request.param) == request.param
        yield request.param
        _C.set_isa(_C.best_isa())
    return isa


isa = isa_fixture(ISA_LEVELS)

# A build without OpenMP (setup.py found none: docs/platforms.md) runs on one thread and refuses
# more. The tests that need more skip there, and only there: in-process through the hook below,
# in subprocesses through this mark.
SINGLE_THREADED = _C.openmp_version() == 0
SINGLE_THREADED_REASON = "built without OpenMP (single-threaded): the test needs more than one thread"
needs_threads = pytest.mark.skipif(SINGLE_THREADED, reason=SINGLE_THREADED_REASON)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In the single-threaded build, a test (or its fixture) that asks for more than one thread
    and is refused (SingleThreadedBuild) is skipped with the reason, not failed."""
    outcome = yield
    if SINGLE_THREADED and call.excinfo is not None and call.excinfo.errisinstance(_C.SingleThreadedBuild):
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: " + SINGLE_THREADED_REASON)


@contextlib.contextmanager
def num_threads(n):
    before = _C.get_num_threads()
    _C.set_num_threads(n)
    try:
        yield
    finally:
        _C.set_num_threads(before)


@pytest.fixture
def restore_threads():
    """Whatever the test sets, the thread count is restored afterwards."""
    before = _C.get_num_threads()
    yield
    _C.set_num_threads(before)


threads = restore_threads   # the name test_gemm.py uses


def unit_embeddings(model):
    """The model with its embedding tables drawn at N(0, 1), nn.Embedding's default and the
    engine's initialisation before 2026-11-25 (now N(0, 1/d_model)): the very values that
    initialisation drew for this seed (the tables are the first tensors drawn), every other
    tensor unchanged. Scaled by sqrt(d_model) they dominate the residual stream. The
    reduced-precision and decoding tests that use it were calibrated on random models in that
    regime (bounds on bf16 rounding flips tight to ~1e-7, seeds that make hypotheses end at
    different lengths or repeat n-grams); what they check does not depend on the scale, so they
    keep it. Returns the model."""
    import numpy as np
    rng = np.random.default_rng(model.seed)
    for name, shape, init in model.params.specs[:2]:
        if init == "embedding":
            model.params.data[name][...] = rng.standard_normal(shape, dtype=np.float32)
    return model


def pytest_configure(config):
    """Prepared corpora (`train --data FILE` caches them) go to a directory of this session, never
    to the user's cache; subprocesses inherit it."""
    import os
    import tempfile

    if "TRANSFORMER_CACHE" not in os.environ:
        os.environ["TRANSFORMER_CACHE"] = tempfile.mkdtemp(prefix="transformer-test-cache-")


def benchmark_script(name):
    """benchmarks/NAME.py imported as a module (the scripts are not a package): for tests that keep
    a benchmark wired to what it measures."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
