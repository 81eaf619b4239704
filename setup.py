"""Builds the optional CPU kernels (jaxspec/csrc/*.cc -> one library, jaxspec/_int4*.so): the
int4 matmul (jaxspec.int4kernel) and the batch-invariant float matmul and attention
(jaxspec.floatkernel).

Everything else about the package is in pyproject.toml. The kernel is an XLA FFI handler loaded
with ctypes by jaxspec/int4kernel.py, compiled against the FFI headers that jaxlib ships
(jax.ffi.include_dir()). It is optional: without a C++ compiler (or jaxlib headers) the install
still succeeds, with a warning, and jaxspec.int4kernel.available() / floatkernel.available() are
False (XLA's own ops; `jaxspec doctor` says which path each format takes).
The AVX2 code is chosen at run time (function target attributes), so the generic flags below
build a library that loads on any x86-64 CPU.
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


_include = _ffi_include_dir()
_flags = ["-std=c++17", "-O3", "-g0"]  # -g0: Python's CFLAGS add -g (a 1.3 MB library)
if _include:  # -isystem: no warnings from the FFI headers
    _flags += ["-isystem", _include]

setup(
    ext_modules=[
        Extension(
            "jaxspec._int4",
            sources=[
                "jaxspec/csrc/int4_matmul.cc",
                "jaxspec/csrc/float_matmul.cc",
                "jaxspec/csrc/attention.cc",
            ],
            extra_compile_args=_flags,
            language="c++",
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
