# cython: language_level=3
"""transformer._C: the only door from Python to the C kernels in csrc/.

Every function here checks dtype, rank, shape, contiguity, writeability and
value ranges, raises TypeError/ValueError naming the offending argument, and
only then calls the kernel with the GIL released. These are the internal,
strict entry points: arrays must already be exactly right (nothing is
converted). The friendly numpy API that converts inputs is transformer.ops.
"""
import numpy as np

from libc.stdint cimport int64_t, uint16_t, uint64_t, uint8_t


cdef extern from "cpu.h" nogil:
    int TF_ISA_GENERIC, TF_ISA_AVX2, TF_ISA_AVX512
    int tf_cpu_best_isa()
    int tf_isa()
    int tf_set_isa(int level)
    const char *tf_isa_name(int level)
    void tf_set_num_threads(int n)
    int tf_get_num_threads()
    int tf_set_thread_limit(int n)
    int tf_openmp_version()
    const char *tf_compiler()
    int tf_probe_team()
    void tf_run_lanes(int lanes, void (*lane)(void *ctx, int l) noexcept nogil, void *ctx)
    int tf_isa_top()


# The levels this architecture names (cpu.h): generic .. amx on x86-64, generic and neon on aarch64.
_ISA_LEVELS = {tf_isa_name(level).decode(): level for level in range(tf_isa_top() + 1)}


class SingleThreadedBuild(ValueError):
    """More than one thread asked of an engine built without OpenMP (setup.py found none)."""


SINGLE_THREADED_FIX = ("this transformer was built without OpenMP and runs on one thread; rebuild it "
                       "with a compiler that has OpenMP (GCC, or on macOS: brew install libomp) or "
                       "install the wheel (docs/platforms.md)")


def set_num_threads(n):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n > 1 and tf_openmp_version() == 0:
        raise SingleThreadedBuild(f"{n} threads refused: {SINGLE_THREADED_FIX}")
    tf_set_num_threads(<int>min(int(n), 1 << 16))


def get_num_threads():
    return tf_get_num_threads()


def set_thread_limit(int n):
    """Cap the threads of the kernels this (calling) thread runs at n (0: no cap, the process's
    count); returns the previous cap. transformer/shards.py: one cap per shard's thread."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return tf_set_thread_limit(n)


def isa():
    """Name of the SIMD level in use."""
    return tf_isa_name(tf_isa()).decode()


def best_isa():
    """Name of the best SIMD level this CPU supports."""
    return tf_isa_name(tf_cpu_best_isa()).decode()


def isa_levels():
    """Every SIMD level, lowest first; each includes the ones before it (csrc/cpu.h)."""
    return sorted(_ISA_LEVELS, key=_ISA_LEVELS.get)


def set_isa(name):
    """Force a SIMD level (isa_levels(): 'generic', 'avx2', 'avx512', 'avx512_vnni',
    'avx512_bf16', 'amx' on x86-64; 'generic', 'neon', 'neon_dotprod' on aarch64); a level above
    the CPU's best is
    clamped.
    Returns the level now in use."""
    if name not in _ISA_LEVELS:
        raise ValueError(f"isa must be one of {sorted(_ISA_LEVELS)}, got {name!r}")
    return tf_isa_name(tf_set_isa(_ISA_LEVELS[name])).decode()


cdef void _run_lane(void *ctx, int l) noexcept nogil:
    with gil:
        (<object>ctx)(l)


def run_lanes(int lanes, lane):
    """lane(l) for every l in range(lanes), each on a thread of one OpenMP team (this thread runs
    lane 0; the others are the workers every kernel's parallel region uses, awake and at hand,
    where a thread of Python's own would wait for them to spin down). Returns when every lane has
    ended; then raises the first lane's error, if any. A lane's kernels get no nested team: for
    lanes of one thread each (transformer/shards.py). Without OpenMP the lanes run in turn here."""
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    errors = [None] * lanes

    def guarded(l):
        try:
            lane(l)
        except BaseException as error:       # a lane's error must not cross the C frames
            errors[l] = error

    cdef void *ctx = <void *>guarded
    with nogil:
        tf_run_lanes(lanes, _run_lane, ctx)
    for error in errors:
        if error is not None:
            raise error


def openmp_version():
    return tf_openmp_version()


def probe_team():
    """How many threads a large parallel region actually runs with (for tests)."""
    cdef int n
    with nogil:
        n = tf_probe_team()
    return n


def compiler():
    return tf_compiler().decode().strip()   # clang's __clang_version__ may end in a space


# ---------------------------------------------------------------------------
# Argument checks shared by every family below (each .pxi is included here).

cdef object _F32 = np.dtype(np.float32)
cdef object _U16 = np.dtype(np.uint16)   # bf16 caches (attention.h): the high half of a float32
cdef object _I64 = np.dtype(np.int64)


cdef inline object _check(object x, str name, object dtype, int ndim=-1,
                          bint writeable=False, bint contiguous=True):
    """x must be an ndarray of `dtype` (and `ndim` when >= 0), C-contiguous when
    `contiguous`, writeable when `writeable`. Returns x."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if ndim >= 0 and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if contiguous and not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not x.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return x


cdef inline object _check_f32(object x, str name, int ndim=-1, bint writeable=False):
    return _check(x, name, _F32, ndim, writeable, True)


cdef inline object _check_mask(object x, str name, int ndim=-1):
    """A bool or uint8 mask, C-contiguous; returned viewed as uint8."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != np.bool_ and x.dtype != np.uint8:
        raise TypeError(f"{name} must have dtype bool or uint8, got {x.dtype}")
    if ndim >= 0 and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return x.view(np.uint8)


cdef inline void _same_shape(object x, str xname, object y, str yname) except *:
    if x.shape != y.shape:
        raise ValueError(f"{yname} must have the shape of {xname} {x.shape}, got {y.shape}")


cdef inline void _no_overlap(object out, str oname, object x, str xname) except *:
    """`out` must not share memory with input `x` (both contiguous: exact test)."""
    if np.may_share_memory(out, x):
        raise ValueError(f"{oname} must not overlap {xname}")


include "gemm.pxi"
include "softmax.pxi"
include "layernorm.pxi"
include "positional.pxi"
include "embedding.pxi"
include "elementwise.pxi"
include "residual_norm.pxi"
include "loss.pxi"
include "optim.pxi"
include "attention.pxi"
include "attention_train.pxi"
include "beam.pxi"
include "qgemm.pxi"
include "decoder.pxi"
include "stream.pxi"
include "bpe.pxi"
