"""Where compiled executables are kept between runs: JAX's persistent compilation cache.

Every command that compiles (`python -m verify serve`, `python -m edge generate`, `jaxspec
generate`, `jaxspec demo`) calls `configure_compilation_cache(compilation_cache_dir(flag))`
before anything compiles, so a second start loads what the first compiled instead of
compiling it again (minutes for a verifier's step shapes on 2 CPU cores). The directory is
`--compilation-cache DIR` ("none": off), else $JAX_COMPILATION_CACHE_DIR, else the per-user
$XDG_CACHE_HOME/jaxspec/xla (~/.cache/jaxspec/xla). Several processes may share it: JAX 0.10
writes an entry in place without a lock, so a process that reads an entry another is still
writing finds it truncated, warns, and compiles that shape itself; nothing wrong is loaded.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Mapping

import jax

from jaxspec import trace_cache

log = logging.getLogger("jaxspec_host.xla_cache")
TRACES = "traces"  # the subdirectory of saved traces (jaxspec.trace_cache)


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
    """Point JAX's persistent compilation cache at `path` (None: off); call it before
    anything compiles. Every step shape is cached, however fast it compiled (unless
    $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise). Returns the directory in
    use, or None — also when it cannot be created (a warning says so; the process then
    compiles without it)."""
    if path is not None:
        try:
            path = str(pathlib.Path(path).expanduser())
            pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        except (OSError, RuntimeError) as e:
            log.warning("compilation cache %s is unusable (%s): compiling without it", path, e)
            path = None
    jax.config.update("jax_enable_compilation_cache", path is not None)
    trace_cache.configure(None if path is None else pathlib.Path(path) / TRACES)
    if path is not None:
        jax.config.update("jax_compilation_cache_dir", path)
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
