"""Where compiled executables are kept between runs: JAX's persistent compilation cache.

Every command that compiles (`python -m verify serve`, `python -m edge generate`, `jaxspec
generate`, `jaxspec demo`) calls `configure_compilation_cache(compilation_cache_dir(flag))`
before anything compiles, so a second start loads what the first compiled instead of
compiling it again (minutes for a verifier's step shapes on 2 CPU cores). The directory is
`--compilation-cache DIR` ("none": off), else $JAX_COMPILATION_CACHE_DIR, else the per-user
$XDG_CACHE_HOME/jaxspec/xla (~/.cache/jaxspec/xla). Several processes may share it: JAX 0.10
writes an entry in place without a lock, so a process that reads an entry another is still
writing finds it truncated, warns, and compiles that shape itself; nothing wrong is loaded.

Its `traces/` subdirectory keeps traced programs (`jaxspec.compilation.trace_cache`), bounded by
$JAXSPEC_TRACE_CACHE_MB (default 1024, least recently used entries evicted). A directory that
another user owns or that group or others may write is not used at all (a warning; compiling
and tracing without it): its entries are programs and executables this process would run.
A read-only one is read and never written; one that cannot be made or whose `traces` is not
a directory gives a warning and runs without what it cannot give, never an exception.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping

import jax

from jaxspec.compilation import trace_cache

log = logging.getLogger("jaxspec_host.xla_cache")
TRACES = "traces"  # the subdirectory of saved traces (jaxspec.compilation.trace_cache)


def compilation_cache_dir(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where compiled executables are kept: `flag` (`--compilation-cache DIR`, or "none":
    nowhere), else $JAX_COMPILATION_CACHE_DIR, else the per-user $XDG_CACHE_HOME/jaxspec/xla
    (~/.cache/jaxspec/xla)."""
    if flag is not None:
        return None if flag.strip().lower() == "none" else flag
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return str(base / "jaxspec" / "xla")


def configure_compilation_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache at `path` (None: off) and keep traces in its
    `traces/`; call it before anything compiles. Every step shape is cached, however fast it
    compiled (unless $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise). Returns the
    directory in use, or None — also when it cannot be created or another user may write it
    (a warning says so; the process then compiles without it). Never raises."""
    if path is not None:
        try:
            path = str(pathlib.Path(path).expanduser())
            pathlib.Path(path).mkdir(parents=True, exist_ok=True)
            why = trace_cache.foreign_writers(path)
        except (OSError, RuntimeError) as e:
            why = f"{type(e).__name__}: {e}"
        if why:
            log.warning("compilation cache %s is unusable (%s): compiling without it", path, why)
            path = None
    jax.config.update("jax_enable_compilation_cache", path is not None)
    traces = None if path is None else pathlib.Path(path) / TRACES
    trace_cache.configure(traces, max_bytes=trace_budget())
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)
        if not os.access(path, os.W_OK):  # read what is there; write nothing (JAX would warn
            log.warning("compilation cache %s is read-only: loading, never saving", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
        elif "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # at each shape)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path


def trace_budget(environ: Mapping[str, str] = os.environ) -> int:
    """Bytes of kept traces before the least recently used are evicted: $JAXSPEC_TRACE_CACHE_MB
    (MiB; a value that is not a positive number: the default, with a warning)."""
    text = environ.get("JAXSPEC_TRACE_CACHE_MB", "").strip()
    if not text:
        return trace_cache.DEFAULT_MAX_BYTES
    try:
        mib = float(text)
        if not mib > 0 or mib == float("inf"):
            raise ValueError(text)
    except ValueError:
        log.warning("JAXSPEC_TRACE_CACHE_MB=%r is not a positive number: using the default", text)
        return trace_cache.DEFAULT_MAX_BYTES
    return int(mib * (1 << 20))


MAPS_SHARE = 0.5  # `bound_compiled_programs` drops compiled programs past this share


def memory_maps(pid: str = "self") -> tuple[int, int] | None:
    """(memory maps this process has, the kernel's limit `vm.max_map_count`), or None where
    it cannot say (not Linux)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            count = sum(1 for _ in f)
        limit = int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None
    return count, limit


def bound_compiled_programs(share: float = MAPS_SHARE) -> bool:
    """Drop every compiled program JAX keeps in memory (`jax.clear_caches`) when this process
    holds more than `share` of the kernel's memory maps; True when it did. Each compiled XLA
    executable maps its code apart, so a long process that compiles shape after shape (the
    bench: 63,170 maps seen) comes near the limit of 65,530, after which XLA dies with "LLVM
    ERROR: Unable to allocate section memory". What is dropped compiles again on next use
    (from the persistent cache where there is one). A server's shapes are bucketed, so it
    never needs this; a caller that runs unbounded work between calls does."""
    maps = memory_maps()
    if maps is None or maps[0] <= share * maps[1]:
        return False
    jax.clear_caches()
    after = memory_maps()
    log.warning(
        "compiled programs dropped: %d of the kernel's %d memory maps were in use (now %s)",
        maps[0], maps[1], "?" if after is None else after[0],
    )  # fmt: skip
    return True
