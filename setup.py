"""Builds the optional CPU kernels (jaxspec/kernels/csrc -> one library,
jaxspec/kernels/_cpu*.so): the batch-invariant float matmul and attention and the int4 matmul,
each as an XLA FFI handler (jaxspec.kernels loads the library with ctypes).

Everything else about the package is in pyproject.toml. The library is compiled against the
FFI headers that jaxlib ships (jax.ffi.include_dir()). It is optional: without a C++ compiler
(or jaxlib headers) the install still succeeds, with a warning, and jaxspec.kernels.available()
is False (XLA's own ops; `jaxspec doctor` says which path is used).
Each instruction set's build of the kernels is its own translation unit with its own
`#pragma GCC target` (isa_avx2.cc, isa_avx512.cc) and the best one the CPU has is chosen at
run time, so the generic flags below build a library that loads on any x86-64 CPU.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _ffi_include_dir() -> str | None:
    """jaxlib's include directory (what jax.ffi.include_dir() returns), without importing jax."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        include = pathlib.Path(root) / "include"
        if (include / "xla" / "ffi" / "api" / "ffi.h").is_file():
            return str(include)
    return None


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the kernel is an optimization."""

    def run(self):
        try:
            super().run()
        except Exception as e:
            self._skip(e)

    def build_extension(self, ext):
        if _include is None:
            self._skip("jaxlib's FFI headers were not found (is jaxlib installed?)")
            return
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    @staticmethod
    def _skip(why) -> None:
        print(
            f"WARNING: jaxspec CPU kernels not built ({why}); "
            "jaxspec falls back to XLA's ops (int4 dequant, float dots: not batch-invariant)",
            file=sys.stderr,
        )


_CSRC = "jaxspec/kernels/csrc"
_SOURCES = ("ffi", "isa_scalar", "isa_avx2", "isa_avx512")
_include = _ffi_include_dir()
# -g0: Python's CFLAGS add -g (a large library); -ffp-contract=off: the compiler never fuses a
# plain a * b + c into one FMA on its own (every build must round the same way)
_flags = ["-std=c++17", "-O3", "-g0", "-ffp-contract=off"]
if _include:  # -isystem: no warnings from the FFI headers
    _flags += ["-isystem", _include]

setup(
    ext_modules=[
        Extension(
            "jaxspec.kernels._cpu",
            sources=[f"{_CSRC}/{name}.cc" for name in _SOURCES],
            depends=[str(p) for p in sorted(pathlib.Path(_CSRC).glob("*.[hi]*"))],
            extra_compile_args=_flags,
            language="c++",
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
