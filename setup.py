"""Builds transformer._C: every C kernel in csrc/ behind the Cython door in pyx/.

One extension module holds all kernels so the SIMD dispatch level and the thread
count are one piece of state for the whole process. Compiled with -O3 and OpenMP,
never -ffast-math (it breaks parity with PyTorch) and never -march=native (one
build must run on any x86-64: the SIMD micro-kernels carry their own target
attributes and are chosen at run time).
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

compile_args = ["-O3", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-unused-function",
                "-Wno-unknown-pragmas"]
link_args = ["-fopenmp"]

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

extension = Extension(
    "transformer._C",
    sources=["pyx/_C.pyx"] + sorted(glob.glob("csrc/**/*.c", recursive=True)),
    include_dirs=["csrc", "pyx", numpy.get_include()],
    depends=sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("pyx/*.pxi")),
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    define_macros=define_macros,
)

setup(
    ext_modules=cythonize(
        [extension],
        compiler_directives={"language_level": "3", "boundscheck": False,
                             "wraparound": False, "cdivision": True,
                             "initializedcheck": False},
    ),
)
