"""A from-scratch CPU Transformer ("Attention Is All You Need", Vaswani et al. 2017).

C/OpenMP kernels (csrc/) behind a Cython door (pyx/), composed here into the
encoder-decoder with hand-written backward passes.
"""
import os as _os

from . import _C
from . import cgroups as _cgroups
from . import cores as _cores

__version__ = "0.1.0"


SingleThreadedBuild = _C.SingleThreadedBuild


def set_num_threads(n):
    """Number of OpenMP threads every kernel may use (the one way to set it). A build without
    OpenMP (build_info()["openmp"] == 0) runs on one thread and raises SingleThreadedBuild, a
    ValueError, for n > 1."""
    _C.set_num_threads(n)


def get_num_threads():
    return _C.get_num_threads()


def build_info():
    """What was built and what is in use: compiler, OpenMP, SIMD level, bf16 and int8 kernels, threads.

    bf16: GEMM operands rounded to bfloat16 while packing, then multiplied with AMX tiles
    (tdpbf16ps) at the amx level, with vdpbf16ps at avx512_bf16, below it by the fp32 FMA kernels
    of the level (exact products, fp32 sums).
    int8: tdpbusd tiles (u8 x s8) at amx, vpdpbusd from avx512_vnni, vpmaddwd on AVX2 and AVX-512,
    plain C below; on aarch64 sdot (s8 x s8) at neon_dotprod, vpmaddwd through SIMDe at neon."""
    return {
        "version": __version__,
        "compiler": _C.compiler(),
        "openmp": _C.openmp_version(),   # 0: built without OpenMP, single-threaded
        "isa": _C.isa(),
        "best_isa": _C.best_isa(),
        "bf16": {"amx": "amx (tdpbf16ps tiles, fp32 sums)",
                 "avx512_bf16": "avx512_bf16 (vdpbf16ps, fp32 sums)"}.get(
                     _C.isa(), f"{_C.isa()} (bf16-rounded operands, fp32 FMA)"),
        "int8": _C.int8_path(),
        "threads": _C.get_num_threads(),
        "threading": "OpenMP" if _C.openmp_version() else
                     "single-threaded: " + _C.SINGLE_THREADED_FIX,
        "cpu_count": _os.cpu_count(),
        "cpu_limit": _cores.cpu_limit(),          # CPUs the cgroup allows (a container's limit), or None
        "memory_limit": _cgroups.memory_limit(),  # bytes the cgroup allows (a container's limit), or None
    }


def _init_from_environment():
    # OMP_NUM_THREADS is read by the OpenMP runtime itself (it sets the default
    # team size); TRANSFORMER_ISA forces a lower SIMD level, for tests and for users.
    isa = _os.environ.get("TRANSFORMER_ISA")
    if isa:
        try:
            _C.set_isa(isa.strip().lower())
        except ValueError:
            raise ValueError(f"TRANSFORMER_ISA must be one of {', '.join(_C.isa_levels())}; "
                             f"got {isa!r}") from None
    threads = _os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if _C.openmp_version() == 0:
        # No OpenMP runtime reads it, and refusing it here would make `import transformer` fail
        # wherever it is set for other programs: one thread, as build_info() says.
        _C.set_num_threads(1)
    elif threads.isdigit() and int(threads) >= 1:
        _C.set_num_threads(int(threads))
    else:
        # OpenMP's default team is the affinity's cores; a container's CPU limit caps it (cores.py)
        _C.set_num_threads(_cores.capped(_C.get_num_threads()))


_init_from_environment()

from . import ops  # noqa: E402
from .config import ModelConfig, PRESETS  # noqa: E402
from .model import Seq2SeqTransformer  # noqa: E402
from .optim import Adam, budget_lr, noam_lr, clip_grad_norm  # noqa: E402
from .distributed import DataParallel  # noqa: E402  (mpi4py is imported when one is made)
