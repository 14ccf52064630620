"""Fixtures every kernel test shares: each SIMD level this CPU has, and the thread count."""
import contextlib

import pytest

from transformer import _C

_LEVELS = ("generic", "avx2", "avx512")
ISA_LEVELS = list(_LEVELS[: _LEVELS.index(_C.best_isa()) + 1])


@pytest.fixture(params=ISA_LEVELS)
def isa(request):
    """Run the test once per SIMD level this CPU supports, then restore the best level."""
    assert _C.set_isa(request.param) == request.param
    yield request.param
    _C.set_isa(_C.best_isa())


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
