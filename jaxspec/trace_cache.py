"""Traces kept between runs: a jitted function's traced program, saved by `jax.export` on
its first call at a shape and loaded on the next run's, so a warm start skips Python tracing.

JAX's persistent compilation cache (`jaxspec_host.xla_cache`) keeps what XLA compiled, but a
jitted function still traces its Python at every shape in every new process, and on the CPU
that became the larger part of a warm start once the matmuls and attention moved into our
kernels (tracing a 30-layer W4A16 prefill through Flax and AQT: ~4 s; compiling it: ~1.5 s).
`jit` wraps `jax.jit`; with a directory `configure`d, each new shape is looked up there:

    key = sha256(function, its static arguments, the arguments' tree, shapes and dtypes,
                 the source of the packages it runs, jax/flax/aqt versions, backend, kernels)

found: the serialized `jax.export.Exported` is loaded and called (through `jax.jit`, with
the same donation), and the compilation cache supplies its executable; not found: the
function is traced once, exported, saved (atomically) and called. The called program is the
traced one: outputs are the same bits (tests/test_trace_cache.py).

Off (plain `jax.jit`) unless a directory is configured, with more than one device (sharded
programs are not cached), or for an argument that is not an array. The key holds every
input of the trace we know of; code that changes what a trace does through anything else
(a monkeypatched function, a global flag) must run with the cache off, as the tests do.
Pure module: imports only jax, numpy and the standard library.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import pathlib
import pickle
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

# Our FFI kernels' custom-call targets: export refuses custom calls it does not know to be
# stable; these are ours, built with the package, so a saved trace names them safely.
CUSTOM_CALLS = ("jaxspec_float_matmul", "jaxspec_attention", "jaxspec_int4_matmul")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PACKAGES = ("jax", "jaxlib", "flax", "aqtp")

_dir: pathlib.Path | None = None
_lock = threading.Lock()
log = logging.getLogger("jaxspec.trace_cache")


_before_load: list[Callable[[], Any]] = []  # e.g. FFI kernels' registration


def before_load(hook: Callable[[], Any]) -> None:
    """Run `hook` before any kept trace is loaded: a loaded program calls the FFI targets
    its trace named, and nothing in this process may have traced (so registered) them yet
    (`jaxspec.kernels` registers its library's here)."""
    _before_load.append(hook)


def configure(path: str | os.PathLike | None) -> pathlib.Path | None:
    """Keep traces in `path` (created), or nowhere (None: every `jit` is plain `jax.jit`)."""
    global _dir
    if path is None:
        _dir = None
        return None
    p = pathlib.Path(path).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    _dir = p
    return p


def directory() -> pathlib.Path | None:
    return _dir


def fingerprint(obj: Any) -> str:
    """A static argument as text that is the same in every process: its repr without the
    memory addresses (a Flax module's repr lists every field; a partial names its function)."""
    return _ADDRESS.sub("", repr(obj))


@functools.cache
def _source_hash(roots: tuple[str, ...]) -> str:
    """sha256 of every .py file under `roots` (the code a trace may run)."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(pathlib.Path(root).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _versions() -> str:
    out = []
    for name in _PACKAGES:
        try:
            out.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}=-")
    return ",".join(out)


def _environment() -> str:
    """What decides a trace besides the code and the arguments: versions, backend, the x64
    flag, our JAXSPEC_* switches (e.g. JAXSPEC_FLOAT_KERNEL) and XLA_FLAGS."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("JAXSPEC_"))
    return repr((
        _versions(), jax.default_backend(), jax.devices()[0].device_kind,
        bool(jax.config.jax_enable_x64), env, os.environ.get("XLA_FLAGS", ""),
    ))  # fmt: skip


def _roots(fun: Callable) -> tuple[str, ...]:
    """The package directories whose source decides `fun`'s trace: its own top-level
    package's and jaxspec's."""
    base = fun.func if isinstance(fun, functools.partial) else fun
    top = sys.modules[base.__module__.split(".")[0]]
    own = top.__file__ or sys.modules[base.__module__].__file__  # (a namespace package: none)
    here = pathlib.Path(__file__).parent
    return tuple(sorted({str(pathlib.Path(own).parent), str(here)}))


def _aval(leaf: Any) -> jax.ShapeDtypeStruct | None:
    """The abstract value of an array leaf (None: not an array, so not cacheable)."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type)
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type)
    if isinstance(leaf, np.ndarray):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return None


class _Entry:
    """One shape's exported program, called through `jax.jit` with the donated leaves."""

    def __init__(self, exported: Any, out_tree: Any, donate: tuple[int, ...]) -> None:
        self.out_tree = out_tree
        self.call = jax.jit(exported.call, donate_argnums=donate)


class CachedJit:
    """`jax.jit(fun, static_argnames=..., donate_argnums=...)` whose traces are kept on disk
    (module doc). Call it, or `lower` it, as the jitted function."""

    def __init__(
        self,
        fun: Callable,
        static_argnames: Sequence[str] = (),
        donate_argnums: Sequence[int] = (),
        donate_argnames: Sequence[str] = (),
    ) -> None:
        self.fun = fun
        self.static = tuple(static_argnames)
        self.signature = inspect.signature(fun)
        names = list(self.signature.parameters)
        self.donated = {names[i] for i in donate_argnums} | set(donate_argnames)
        self.jitted = jax.jit(  # (None, not (): jit then maps names to positions itself)
            fun, static_argnames=self.static, donate_argnums=tuple(donate_argnums) or None,
            donate_argnames=tuple(donate_argnames) or None,
        )  # fmt: skip
        self.entries: dict[Any, _Entry] = {}
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        found = self._entry(args, kwargs)
        if found is None:
            return self.jitted(*args, **kwargs)
        entry, leaves = found
        return jax.tree.unflatten(entry.out_tree, entry.call(*leaves))

    def __getattr__(self, name: str) -> Any:
        """Everything else of the plain jitted function (e.g. its in-memory cache's size)."""
        if name == "jitted":  # not set yet (during construction)
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(...).lower`: of the saved program where the cache applies."""
        found = self._entry(args, kwargs)
        if found is None:
            return self.jitted.lower(*args, **kwargs)
        entry, leaves = found
        return entry.call.lower(*leaves)

    # --- the cache ------------------------------------------------------------------------

    def _split(self, args: tuple, kwargs: dict) -> tuple[dict, list[str], list]:
        """(static arguments by name, dynamic argument names, their values) in order."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        static = {k: v for k, v in bound.arguments.items() if k in self.static}
        names = [k for k in bound.arguments if k not in self.static]
        return static, names, [bound.arguments[k] for k in names]

    def _entry(self, args: tuple, kwargs: dict) -> tuple[_Entry, list] | None:
        if _dir is None or jax.device_count() != 1:
            return None
        static, names, values = self._split(args, kwargs)
        leaves, in_tree = jax.tree.flatten(values)
        avals = [_aval(x) for x in leaves]
        if any(a is None for a in avals):
            return None
        shapes = tuple((a.shape, a.dtype, a.weak_type) for a in avals)
        # In memory, the static values themselves (hashable, as jit requires): no repr per call.
        memo = (in_tree, shapes, tuple(static[k] for k in sorted(static)))
        if memo not in self.entries:
            try:
                self.entries[memo] = self._load_or_trace(static, names, values, in_tree, avals)
            except Exception as e:  # export cannot take it: trace as ever
                log.warning("not keeping the trace of %s: %s", _name(self.fun), e)
                self.entries[memo] = None
        entry = self.entries[memo]
        return None if entry is None else (entry, leaves)

    def _donated_leaves(self, names: list[str], values: list) -> tuple[int, ...]:
        """Leaf indices of the donated positional parameters."""
        out, i = [], 0
        for name, value in zip(names, values, strict=True):
            n = len(jax.tree.leaves(value))
            if name in self.donated:
                out += range(i, i + n)
            i += n
        return tuple(out)

    def _key(self, static: dict, in_tree: Any, avals: list) -> str:
        parts = (
            f"{self.fun.__module__}.{getattr(self.fun, '__qualname__', fingerprint(self.fun))}",
            fingerprint(self.fun) if isinstance(self.fun, functools.partial) else "",
            sorted((k, fingerprint(v)) for k, v in static.items()),
            str(in_tree),
            [(a.shape, str(a.dtype), a.weak_type) for a in avals],
            _source_hash(_roots(self.fun)),
            _environment(),
        )
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def _load_or_trace(
        self, static: dict, names: list[str], values: list, in_tree: Any, avals: list
    ) -> _Entry:
        donate = self._donated_leaves(names, values)
        path = _dir / f"{_name(self.fun)}-{self._key(static, in_tree, avals)}"
        try:
            exported_bytes, out_tree = pickle.loads(path.read_bytes())
            for hook in _before_load:
                hook()
            return _Entry(jax.export.deserialize(exported_bytes), out_tree, donate)
        except (OSError, ValueError, pickle.UnpicklingError, EOFError, TypeError):
            pass  # not saved yet (or unreadable): trace it now
        exported, out_tree = self._export(static, names, in_tree, avals)
        _save(path, pickle.dumps((exported.serialize(), out_tree)))
        return _Entry(exported, out_tree, donate)

    def _export(self, static: dict, names: list[str], in_tree: Any, avals: list) -> tuple:
        """Trace the function on the flat leaves and export it; returns (Exported, out tree)."""
        box: dict[str, Any] = {}

        def flat(*leaves: Any) -> list:
            values = jax.tree.unflatten(in_tree, leaves)
            out = self.fun(**static, **dict(zip(names, values, strict=True)))
            out_leaves, box["tree"] = jax.tree.flatten(out)
            return out_leaves

        checks = [jax.export.DisabledSafetyCheck.custom_call(n) for n in CUSTOM_CALLS]
        exported = jax.export.export(jax.jit(flat), disabled_checks=checks)(*avals)
        return exported, box["tree"]


def _name(fun: Callable) -> str:
    base = fun.func if isinstance(fun, functools.partial) else fun
    return getattr(base, "__name__", "fn")


def _save(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to `path` atomically (several processes may share the directory)."""
    with _lock:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            pathlib.Path(tmp).unlink(missing_ok=True)


def jit(
    fun: Callable | None = None,
    *,
    static_argnames: Sequence[str] = (),
    donate_argnums: Sequence[int] = (),
    donate_argnames: Sequence[str] = (),
) -> Any:
    """`jax.jit` with traces kept on disk (module doc); usable as a decorator with or
    without arguments."""
    if fun is None:
        return functools.partial(
            jit, static_argnames=static_argnames, donate_argnums=donate_argnums,
            donate_argnames=donate_argnames,
        )  # fmt: skip
    return CachedJit(fun, static_argnames, donate_argnums, donate_argnames)
