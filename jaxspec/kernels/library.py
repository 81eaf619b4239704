"""The loader of jaxspec's CPU kernels and the controls every kernel shares.

The library (`jaxspec/kernels/_cpu*.so`, built by `pip install` from `csrc/`, see setup.py)
holds XLA FFI handlers that XLA:CPU calls from jitted code:

- `jaxspec.kernels.dense`: the batch-invariant float32/bfloat16-weight matmul (every linear
  layer and the tied head of a float model);
- `jaxspec.kernels.attention`: the batch-invariant grouped-query attention over the cache;
- `jaxspec.kernels.int4`: the int4 x float32 matmul of W4A16 models;
- `jaxspec.kernels.int8`: the int8 x float32 matmul of a head kept at 8 bits (GGUF's Q8_0).

Each kernel is written once (csrc/body_*.inc) and built for three instruction sets: AVX-512,
AVX2 (both with FMA and F16C) and portable C++. The best the CPU has is chosen at load, and
every build gives the same bits (tests hold them to it). The controls below govern every
kernel alike:

    available() / why_unavailable() / status()     is it built and loaded, and which path
    isa() / set_isa("AVX2")                        the instruction set in use (tests, benches)
    threads() / set_threads(n)                     threads one call may use (0: XLA's pool)

`JAXSPEC_KERNEL_THREADS=n` sets the thread cap at load. The library is optional: without a
compiler at install, `available()` is False and every model runs on XLA's own ops.

Pure module: imports only jax, the standard library and `jaxspec.compilation.trace_cache`.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import pathlib
import threading

import jax

from jaxspec.compilation import trace_cache

_HERE = pathlib.Path(__file__).resolve().parent
# FFI target name -> the handler's symbol in the library
TARGETS = {
    "jaxspec_float_matmul": "JaxspecFloatMatmul",
    "jaxspec_int4_matmul": "JaxspecInt4Matmul",
    "jaxspec_int8_matmul": "JaxspecInt8Matmul",
    "jaxspec_attention": "JaxspecAttention",
    "jaxspec_attention_cache": "JaxspecAttentionCache",
}
ISA_NAMES = {3: "AVX-512", 2: "AVX2", 0: "scalar"}
_ISA_CODES = {"best": 99, "AVX-512": 3, "AVX2": 2, "scalar": 0}

_lock = threading.Lock()
_state: dict | None = None  # {"lib": CDLL | None, "path": Path | None, "why": str}


def library_path() -> pathlib.Path | None:
    """The built library next to this file (setuptools names it _cpu<EXT_SUFFIX>), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"_cpu{suffix}"
        if path.is_file():
            return path
    found = sorted(_HERE.glob("_cpu*.so"))
    return found[0] if found else None


def _open(path: pathlib.Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name in ("best_isa", "isa", "threads"):
        getattr(lib, f"jaxspec_kernels_{name}").restype = ctypes.c_int
    for name in ("set_isa", "set_threads"):
        fn = getattr(lib, f"jaxspec_kernels_{name}")
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    probe = lib.jaxspec_kernels_read_bandwidth
    probe.restype, probe.argtypes = ctypes.c_double, [ctypes.c_double, ctypes.c_int, ctypes.c_int]
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    value = os.environ.get("JAXSPEC_KERNEL_THREADS", "").strip()
    if value.isdigit():
        lib.jaxspec_kernels_set_threads(int(value))
    return lib


def _load() -> dict:
    global _state
    with _lock:
        if _state is None:
            state: dict = {"lib": None, "path": library_path(), "why": ""}
            if state["path"] is None:
                state["why"] = (
                    "not built (no jaxspec/kernels/_cpu*.so: no C++ compiler at install, or "
                    "its build failed)"
                )
            else:
                try:
                    state["lib"] = _open(state["path"])
                except Exception as e:  # a broken or foreign build: report it, never raise
                    state["why"] = f"failed to load ({type(e).__name__}: {e})"
            _state = state
        return _state


def library() -> ctypes.CDLL | None:
    """The loaded library with its FFI targets registered (once), or None."""
    try:
        return _load()["lib"]
    except Exception:
        return None


def available() -> bool:
    """True when the library is loaded and its targets registered with XLA (never raises)."""
    return library() is not None


def why_unavailable() -> str:
    """Why `library()` is None ("" when it is loaded)."""
    try:
        return _load()["why"]
    except Exception as e:
        return f"{type(e).__name__}: {e}"


trace_cache.before_load(available)  # a kept trace may call these targets untraced
trace_cache.allow_custom_calls(TARGETS)
# a kept trace is valid only with the very library it was traced against (or none)
trace_cache.key_part("kernel_lib", lambda: trace_cache.file_digest(available() and library_path()))


def _lib_or_raise() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(status())
    return lib


def isa() -> str | None:
    """The instruction set every kernel uses ("AVX-512", "AVX2" or "scalar"); None when the
    library is not loaded."""
    lib = library()
    return None if lib is None else ISA_NAMES.get(lib.jaxspec_kernels_isa(), "unknown")


def set_isa(name: str) -> str:
    """Forces every kernel's instruction set ("scalar", "AVX2", "AVX-512", each only as far as
    the CPU has it; "best" is the default). Returns the one now in use. Every path gives the
    same bits; a function traced before still runs, on the new path (the choice is the
    library's, not the trace's)."""
    if name not in _ISA_CODES:
        raise ValueError(f"isa must be one of {sorted(_ISA_CODES)}, got {name!r}")
    return ISA_NAMES[_lib_or_raise().jaxspec_kernels_set_isa(_ISA_CODES[name])]


def threads() -> int:
    """The cap on threads one call uses (0: the size of XLA's CPU pool)."""
    lib = library()
    return 0 if lib is None else lib.jaxspec_kernels_threads()


def set_threads(n: int) -> int:
    """Caps the threads one call uses, the calling one included; 0 = XLA's pool size."""
    if n < 0:
        raise ValueError(f"threads must be >= 0, got {n}")
    return _lib_or_raise().jaxspec_kernels_set_threads(n)


def read_bandwidth(gib: float = 1.0, threads: int = 0, repeats: int = 3) -> float:
    """This machine's read bandwidth in bytes/s as the kernels reach it: `gib` GiB read front to
    back by `threads` threads (0: every CPU the process may use) with the kernels' own
    streaming loop, the best of `repeats` passes. The limit every roofline is measured against."""
    if gib <= 0 or threads < 0 or repeats < 1:
        raise ValueError(
            f"need gib > 0, threads >= 0, repeats >= 1; got {gib}, {threads}, {repeats}"
        )
    return float(_lib_or_raise().jaxspec_kernels_read_bandwidth(gib, threads, repeats))


def status() -> str:
    """One line for start-up and doctor output."""
    state = _load()
    if state["lib"] is None:
        return f"CPU kernels: {state['why']} - XLA's ops (float dots not batch-invariant)"
    root, path = _HERE.parent.parent, state["path"]
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"CPU kernels: {isa()}, threads {threads() or 'all'} ({shown})"
