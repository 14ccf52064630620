"""Builds transformer._C: every C kernel in csrc/ behind the Cython door in pyx/.

One extension module holds all kernels so the SIMD dispatch level and the thread
count are one piece of state for the whole process. Compiled with -O3 and OpenMP,
never -ffast-math (it breaks parity with PyTorch) and never -march=native (one
build must run on any x86-64: the SIMD micro-kernels carry their own target
attributes and are chosen at run time).

OpenMP is probed, not assumed (docs/platforms.md): GCC's and LLVM clang's -fopenmp, else Apple
clang's -Xpreprocessor -fopenmp with Homebrew's libomp. A compiler with neither builds a
single-threaded engine that says so (build_info()["openmp"] == 0) and refuses more than one
thread. TRANSFORMER_OPENMP=0 builds that engine on purpose (tests); TRANSFORMER_OPENMP=1 makes a
missing OpenMP an error (wheels, which must never ship single-threaded by accident).

On ARM64 the SIMD kernels are the AVX2 ones compiled through SIMDe into NEON (csrc/simd.h).
Cross builds (.ci/arm64) set TRANSFORMER_TARGET_MACHINE=aarch64 and TRANSFORMER_CROSS=1 (the
OpenMP probe is compiled and linked, not run).
"""
import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

compile_args = ["-O3", "-fno-math-errno", "-Wall", "-Wno-unused-function", "-Wno-unknown-pragmas"]
link_args = []

if os.environ.get("TRANSFORMER_SANITIZE"):
    # AddressSanitizer + UBSan (issue 6): every finding aborts the process, so a test run fails.
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]
    compile_args = [a for a in compile_args if a != "-O3"] + ["-O1"] + san
    link_args += san

define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if os.environ.get("TRANSFORMER_EMULATE_X86"):
    # Test build, never shipped (csrc/simd.h): every intrinsic from SIMDe (apt install
    # libsimde-dev) as portable C and every SIMD level reported present, so the AVX-512, VNNI
    # and bf16 kernels run and are tested on a CPU without them. Much slower.
    define_macros.append(("TF_EMULATE_X86", "1"))
    compile_args = [a for a in compile_args if a != "-O3"] + ["-O1", "-Wno-uninitialized", "-Wno-psabi"]

def simde_include():
    """The folder holding SIMDe's simde/ headers: SIMDE_INCLUDE, the simde-py package (a build
    requirement on aarch64, pyproject.toml), or the system's; None when there is none."""
    candidates = [os.environ.get("SIMDE_INCLUDE", "")]
    try:
        import simde_py
        candidates.append(simde_py.get_include())
    except ImportError:
        pass
    candidates.append("/usr/include")
    for folder in candidates:
        if folder and os.path.isfile(os.path.join(folder, "simde", "x86", "avx2.h")):
            return folder
    return None


include_dirs = ["csrc", "pyx", numpy.get_include()]
machine = os.environ.get("TRANSFORMER_TARGET_MACHINE", platform.machine()).lower()
if machine in ("aarch64", "arm64"):
    # ARM64: the AVX2 kernels through SIMDe's NEON translation are the neon level (csrc/simd.h);
    # without SIMDe's headers, the portable C kernels only (build_info() says isa "generic").
    # The kernels' C rounds every product on its own unless it calls fmaf: x86-64's baseline has
    # no FMA, so an x86 build never fuses, but ARM64's has, and GCC would fuse a*b + c there
    # (dx += dout * act'(x) then differed from dx + (dout * act'(x)) by an ulp at the generic level).
    compile_args.append("-ffp-contract=off")
    simde = simde_include()
    if simde:
        define_macros.append(("TF_SIMDE_NEON", "1"))
        include_dirs.append(simde)
        compile_args += ["-Wno-uninitialized", "-Wno-psabi"]
    else:
        print("setup.py: SIMDe not found (pip install simde-py, or SIMDE_INCLUDE): "
              "the portable C kernels only, no neon level", file=sys.stderr)

extension = Extension(
    "transformer._C",
    sources=["pyx/_C.pyx"] + sorted(glob.glob("csrc/**/*.c", recursive=True)),
    include_dirs=include_dirs,
    depends=sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("pyx/*.pxi")),
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    define_macros=define_macros,
)

OPENMP_PROBE = """#include <omp.h>
int main(void) { int n = 0;
#pragma omp parallel reduction(+ : n)
    n += 1;
    return n > 0 && omp_get_max_threads() > 0 ? 0 : 1; }
"""


def homebrew_libomp():
    """Homebrew's libomp prefix (Apple clang has no OpenMP runtime of its own), or None."""
    prefixes = [os.environ.get("LIBOMP_PREFIX", "")]
    if shutil.which("brew"):
        try:
            prefixes.append(subprocess.run(["brew", "--prefix", "libomp"], capture_output=True,
                                           text=True, timeout=60).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    prefixes += ["/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"]
    for prefix in prefixes:
        if prefix and os.path.isfile(os.path.join(prefix, "include", "omp.h")):
            return prefix
    return None


def openmp_candidates():
    """(compile flags, link flags) to try, most common first."""
    yield ["-fopenmp"], ["-fopenmp"]                            # GCC; LLVM clang with libomp
    prefix = homebrew_libomp()
    if prefix:                                                  # Apple clang + Homebrew's libomp
        lib = os.path.join(prefix, "lib")
        yield (["-Xpreprocessor", "-fopenmp", "-I" + os.path.join(prefix, "include")],
               ["-L" + lib, "-lomp", "-Wl,-rpath," + lib])


def probe_openmp(compiler):
    """The first candidate that compiles, links and runs a parallel region with `compiler`
    (the one build_ext uses: CC is honoured), or None."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(OPENMP_PROBE)
        for cflags, ldflags in openmp_candidates():
            try:
                objects = compiler.compile([source], output_dir=tmp, extra_postargs=cflags)
                exe = os.path.join(tmp, "probe")
                compiler.link_executable(objects, exe, extra_postargs=ldflags)
            except Exception:   # CompileError, LinkError: this candidate does not work here
                continue
            if os.environ.get("TRANSFORMER_CROSS") or subprocess.run([exe]).returncode == 0:
                return cflags, ldflags
    return None


class BuildExt(build_ext):
    """build_ext that adds OpenMP's flags when the compiler has OpenMP (see the docstring above)."""

    def build_extensions(self):
        wanted = os.environ.get("TRANSFORMER_OPENMP", "auto").strip().lower()
        found = None if wanted in ("0", "off", "no") else probe_openmp(self.compiler)
        if found is None and wanted in ("1", "on", "yes"):
            sys.exit("setup.py: TRANSFORMER_OPENMP=1 but the compiler has no OpenMP "
                     "(GCC's -fopenmp, or Apple clang with Homebrew's libomp: brew install libomp)")
        if found is None:
            print("setup.py: building WITHOUT OpenMP: a single-threaded engine "
                  "(docs/platforms.md says how to get OpenMP)", file=sys.stderr)
        for ext in self.extensions:
            if found is not None:
                ext.extra_compile_args = found[0] + ext.extra_compile_args
                ext.extra_link_args = found[1] + ext.extra_link_args
        jobs = os.cpu_count() if self.parallel is True else int(self.parallel or 1)
        if jobs > 1:
            self.compile_files_in_parallel(jobs)
        super().build_extensions()

    def compile_files_in_parallel(self, jobs):
        """`-j N` compiles N source files at a time. setuptools' own -j runs whole extensions in
        parallel, and there is one: without this its ~40 files compile one after another. Each
        file is compiled by the same call with the same flags as before (same objects, same
        bits); the Cython module, first in the list and the longest, starts first."""
        from concurrent.futures import ThreadPoolExecutor
        compile_sources = self.compiler.compile

        def compile_each(sources, output_dir=None, **kwargs):
            for obj in self.compiler.object_filenames(sources, output_dir=output_dir):
                os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)   # not racing for it
            with ThreadPoolExecutor(jobs) as pool:
                parts = list(pool.map(lambda source: compile_sources([source], output_dir=output_dir,
                                                                     **kwargs), sources))
            return [obj for part in parts for obj in part]

        self.compiler.compile = compile_each


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        [extension],
        compiler_directives={"language_level": "3", "boundscheck": False,
                             "wraparound": False, "cdivision": True,
                             "initializedcheck": False},
    ),
)
