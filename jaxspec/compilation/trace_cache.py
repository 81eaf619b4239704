"""Traces kept between runs: a jitted function's traced program, saved by `jax.export` on
its first call at a shape and loaded on the next run's, so a warm start skips Python tracing.

JAX's persistent compilation cache (`jaxspec_host.xla_cache`) keeps what XLA compiled, but a
jitted function still traces its Python at every shape in every new process, and on the CPU
that became the larger part of a warm start once the matmuls and attention moved into our
kernels (tracing a 30-layer W4A16 prefill through Flax and AQT: ~4 s; compiling it: ~1.5 s).
`jit` wraps `jax.jit`; with a directory `configure`d, each new shape is looked up there under

    key = sha256(format, function, its static arguments, the arguments' tree, shapes and
                 dtypes, the source of the packages it runs, jax/jaxlib/flax/aqtp/numpy
                 versions, backend and device kind, every JAX setting (`jax.config.values`
                 but caching, logging and dump settings), the variables of ENVIRONMENT,
                 and every `key_part` registered: which FFI kernels a trace uses and the
                 built library's sha256)

found and sound: the exported program is loaded and called (through `jax.jit`, with the same
donation), and the compilation cache supplies its executable; not found: the function is
traced once, exported, saved (atomically) and called. The called program is the traced one:
outputs are the same bits (tests/test_trace_cache.py).

An entry (`<function>-<key>.trace`) is data, never code (no pickle):

    magic b"JXTRACE\\n" | format u32 | header bytes u32 | payload bytes u64   (little-endian)
    header: JSON {"key", "function", "in_tree", "avals", "out_tree"}
    payload: `jax.export`'s serialization of the program (flatbuffer + StableHLO bytecode)
    sha256 of everything before it (32 bytes)

An entry that is missing a byte, has one flipped, was stored under another key, holds another
call's argument tree or shapes, or fails to deserialize is traced anew and rewritten, with a
warning: never a crash (the checksum is checked first: StableHLO's parser can crash the process
on corrupt bytecode). Trees are JSON (`trace_trees`: node types by module and name, looked up
among modules already imported, never imported). The directory must be writable by this user
only (`foreign_writers`): a loaded program runs with the server's rights and can call our
kernels with any sizes, and no format can tell a planted entry from ours, so a directory (or
entry) that another user owns or can write is not used. Entries are evicted least recently used
(a load touches the file) once the directory holds more than `max_bytes` (DEFAULT_MAX_BYTES). A
read-only directory is read and never written.

Off (plain `jax.jit`) unless a directory is configured, with more than one device (sharded
programs are not cached), under `jax.disable_jit`, or for an argument that is not an array.
The key holds every input of the trace we know of; code that changes what a trace does
through anything else (a monkeypatched function, a global flag) must run with the cache off,
as the tests do. Pure module: imports only jax, numpy and the standard library.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import pathlib
import re
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import numpy as np

from jaxspec.compilation.trace_trees import Unusable, tree_from_json, tree_to_json

# Our FFI kernels' custom-call targets (`jaxspec.kernels` registers them with
# `allow_custom_calls`): export refuses custom calls it does not know to be stable; these are
# ours, built with the package (the library's sha256 is in every key), so a trace names them.
CUSTOM_CALLS: set[str] = set()
FORMAT = 1  # the entry layout (module doc); another number is a miss, traced anew
MAGIC = b"JXTRACE\n"
SUFFIX = ".trace"
DEFAULT_MAX_BYTES = 1 << 30  # evict least recently used entries beyond this (1 GiB)
# Environment variables that change a traced program (and nothing else of the environment:
# tokens and keys must not re-trace everything at each rotation).
ENVIRONMENT = ("JAXSPEC_FLOAT_KERNEL",)
# JAX settings that cannot change a traced program but may differ between two runs of one
# command (caches, logs, dumps, transfer guards, multi-host plumbing); every other one of
# `jax.config.values` is in the key.
_CONFIG_IGNORED = (
    "jax_compilation_cache_", "jax_enable_compilation_cache", "jax_persistent_cache_",
    "jax_raise_persistent_cache_errors", "jax_explain_cache_misses", "jax_log_compiles",
    "jax_logging_level", "jax_debug_log_modules", "jax_dump_ir_", "jax_include_debug_info",
    "jax_pprint_use_color", "jax_traceback_filtering", "jax_tracer_error_num_traceback",
    "jax_compiler_detailed_logging", "jax_captured_constants_", "jax_cross_host_",
    "jax_cpu_get_", "jax_share_binary_between_hosts", "jax_transfer_guard",
    "jax_check_proxy_envs", "jax_enable_preemption_service", "jax_platforms",
    "jax_platform_name",
)  # fmt: skip
# The settings a process may change between two calls (JAX's context managers): part of the
# in-memory lookup as well, so a changed one is looked up (and keyed) again.
_CONFIG_LIVE = (
    "jax_enable_x64", "jax_threefry_partitionable", "jax_default_matmul_precision",
    "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion", "jax_default_prng_impl",
    "jax_enable_custom_prng", "jax_softmax_custom_jvp",
)  # fmt: skip
_HEAD = struct.Struct("<8sIIQ")  # magic, format, header bytes, payload bytes
_DIGEST = 32  # sha256
_ENTRY = re.compile(r".+-[0-9a-f]{64}(\.trace)?")  # (no suffix: the pickles of format 0)
_STALE_TMP_S = 3600.0  # a writer's temporary file older than this was left by a crash
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PACKAGES = ("jax", "jaxlib", "flax", "aqtp", "numpy")

_dir: pathlib.Path | None = None
_max_bytes = DEFAULT_MAX_BYTES
_lock = threading.Lock()
_warned: set[str] = set()
log = logging.getLogger("jaxspec.compilation.trace_cache")


_before_load: list[Callable[[], Any]] = []  # e.g. FFI kernels' registration
_key_parts: dict[str, Callable[[], str]] = {}  # name -> what it adds to every key


def before_load(hook: Callable[[], Any]) -> None:
    """Run `hook` before any kept trace is loaded: a loaded program calls the FFI targets
    its trace named, and nothing in this process may have traced (so registered) them yet
    (`jaxspec.kernels` registers its library's here)."""
    _before_load.append(hook)


def allow_custom_calls(names: Iterable[str]) -> None:
    """Custom-call targets a kept trace may call (our own kernels'; `CUSTOM_CALLS`)."""
    CUSTOM_CALLS.update(names)


def key_part(name: str, part: Callable[[], str] | None) -> None:
    """Add `part()` under `name` to every key (None: remove it): something outside the
    arguments and the source that changes what a trace holds, e.g. whether our FFI kernels
    are used and the built library's sha256 (`file_digest`). The kernel modules register
    theirs here (this module cannot import them: they import it). Called when a key is made;
    an exception counts as its own value (that shape is then kept under a key of its own)."""
    if part is None:
        _key_parts.pop(name, None)
    else:
        _key_parts[name] = part


def key_parts() -> dict[str, str]:
    """The registered parts as they are now (name -> value)."""
    out = {}
    for name, part in sorted(_key_parts.items()):
        try:
            out[name] = str(part())
        except Exception as e:
            out[name] = f"error: {type(e).__name__}"
    return out


@functools.cache
def _digest(path: str, size: int, mtime_ns: int, inode: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | os.PathLike | bool | None) -> str:
    """sha256 of a file (e.g. the kernel library), "absent" for no path (None, False, "") or
    no file; computed once per file version."""
    if not path:
        return "absent"
    try:
        st = os.stat(path)
        return _digest(str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        return "absent"


def foreign_writers(path: str | os.PathLike | int) -> str:
    """Why a directory (or file, or open descriptor) may hold what another user wrote:
    owned by someone else, or writable by group or others ("" when only this user can)."""
    st = os.stat(path)
    me = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid != me:
        return f"owned by uid {st.st_uid}, not this process's {me}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _warn_once(message: str, *args: Any) -> None:
    text = message % args
    if text not in _warned:
        _warned.add(text)
        log.warning("%s", text)


def configure(
    path: str | os.PathLike | None, max_bytes: int = DEFAULT_MAX_BYTES
) -> pathlib.Path | None:
    """Keep traces in `path` (created, mode 700), or nowhere (None: every `jit` is plain
    `jax.jit`). A directory that cannot be made or is not ours alone (`foreign_writers`)
    gives a warning and None, never an exception; a read-only one is read, not written.
    Beyond `max_bytes` the least recently used entries are removed."""
    global _dir, _max_bytes
    _dir, _max_bytes = None, max_bytes
    if path is None:
        return None
    p = pathlib.Path(path).expanduser()
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = foreign_writers(p)
    except (OSError, RuntimeError) as e:
        why = f"{type(e).__name__}: {e}"
    if why:
        log.warning("kept traces are off: %s is unusable (%s); every process traces anew", p, why)
        return None
    if not os.access(p, os.W_OK):
        log.warning("kept traces in %s are read-only: loaded, never written", p)
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


@functools.cache
def _versions() -> str:
    out = []
    for name in _PACKAGES:
        try:
            out.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}=-")
    return ",".join(out)


def jax_settings() -> dict[str, str]:
    """Every JAX setting in the key (name -> its repr): all of `jax.config.values` but those
    that cannot change a program (caches, logging, dumps; `_CONFIG_IGNORED`)."""
    return {
        k: fingerprint(v)
        for k, v in sorted(jax.config.values.items())
        if not k.startswith(_CONFIG_IGNORED)
    }


def context() -> dict[str, Any]:
    """What decides a trace besides the code and the arguments (module doc's key)."""
    return {
        "versions": _versions(),
        "backend": [jax.default_backend(), jax.devices()[0].device_kind],
        "jax": jax_settings(),
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
        "parts": key_parts(),
    }


def _roots(fun: Callable) -> tuple[str, ...]:
    """The package directories whose source decides `fun`'s trace: its own top-level
    package's and jaxspec's."""
    base = fun.func if isinstance(fun, functools.partial) else fun
    top = sys.modules[base.__module__.split(".")[0]]
    own = top.__file__ or sys.modules[base.__module__].__file__  # (a namespace package: none)
    here = pathlib.Path(__file__).parent.parent  # jaxspec/
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


def _avals_json(avals: list) -> list:
    return [[list(a.shape), str(a.dtype), bool(a.weak_type)] for a in avals]


# --- entries on disk -----------------------------------------------------------------------


def encode(header: dict, payload: bytes) -> bytes:
    """An entry's bytes (module doc): fixed head, JSON header, payload, sha256."""
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = _HEAD.pack(MAGIC, FORMAT, len(text), len(payload)) + text + bytes(payload)
    return body + hashlib.sha256(body).digest()


def decode(data: bytes, key: str) -> tuple[dict, bytes]:
    """(header, payload) of an entry kept under `key`; Unusable names what is wrong."""
    if len(data) < _HEAD.size + _DIGEST:
        raise Unusable(f"{len(data)} bytes, shorter than any entry")
    magic, fmt, n_header, n_payload = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise Unusable("not a kept trace (no magic: e.g. a pickle of an older version)")
    if fmt != FORMAT:
        raise Unusable(f"format {fmt}, this version reads {FORMAT}")
    if _HEAD.size + n_header + n_payload + _DIGEST != len(data):
        raise Unusable(f"{len(data)} bytes, its lengths say otherwise (truncated or padded)")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise Unusable("checksum mismatch (a changed byte)")
    try:
        header = json.loads(body[_HEAD.size : _HEAD.size + n_header])
    except ValueError as e:
        raise Unusable(f"its header is not JSON ({e})") from e
    if not isinstance(header, dict) or header.get("key") != key:
        raise Unusable("it was stored under another key")
    return header, body[_HEAD.size + n_header :]


def read(path: pathlib.Path) -> bytes:
    """An entry's bytes, from a plain file this user alone can write (no symlink followed);
    FileNotFoundError when there is none, Unusable otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise Unusable(f"unreadable ({type(e).__name__}: {e})") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Unusable("not a plain file")
        why = foreign_writers(f.fileno())
        if why:
            raise Unusable(why)
        return f.read()


def _save(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to `path` atomically (several processes may share the directory), then
    evict; a directory that cannot be written gives one warning, no exception."""
    with _lock:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            _warn_once("cannot write kept traces in %s (%s): not saving", path.parent, e)
            if tmp is not None:
                pathlib.Path(tmp).unlink(missing_ok=True)
            return
    evict(path.parent, _max_bytes)


def _touch(path: pathlib.Path) -> None:
    """Mark an entry used now (eviction removes the least recently used first)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only directory: its entries are never evicted either


def evict(directory: pathlib.Path, max_bytes: int) -> list[pathlib.Path]:
    """Remove the least recently used entries (oldest modification time: written or loaded)
    until the rest hold at most `max_bytes`, and writers' temporary files an hour old.
    Returns what was removed."""
    found, removed, now = [], [], time.time()
    try:
        names = list(os.scandir(directory))
    except OSError:
        return removed
    for item in names:
        try:
            st = item.stat(follow_symlinks=False)
            if item.name.startswith(".tmp-") and now - st.st_mtime > _STALE_TMP_S:
                os.unlink(item.path)
            elif _ENTRY.fullmatch(item.name) and stat.S_ISREG(st.st_mode):
                found.append((st.st_mtime_ns, st.st_size, item.path))
        except OSError:
            continue  # removed by another process meanwhile
    total = 0
    for _, size, where in sorted(found, reverse=True):  # newest first
        total += size
        if total > max_bytes:
            try:
                os.unlink(where)
                removed.append(pathlib.Path(where))
            except OSError:
                pass
    return removed


# --- the wrapper ---------------------------------------------------------------------------


class _Entry:
    """One shape's exported program, called through `jax.jit` with the donated leaves."""

    def __init__(self, exported: Any, out_tree: Any, donate: tuple[int, ...]) -> None:
        self.out_tree = out_tree
        self.call = jax.jit(exported.call, donate_argnums=donate)


def _check_exported(exported: Any, avals: list, out_tree: Any) -> None:
    """The deserialized program takes this call's arguments and gives `out_tree`'s leaves."""
    have = [(tuple(a.shape), str(a.dtype)) for a in exported.in_avals]
    if have != [(tuple(a.shape), str(a.dtype)) for a in avals]:
        raise Unusable("its program takes other shapes than the call's")
    if len(exported.out_avals) != out_tree.num_leaves:
        raise Unusable("its program's outputs do not fill its output tree")
    if exported.nr_devices != 1 or jax.default_backend() not in exported.platforms:
        raise Unusable(f"its program is for {exported.platforms} x{exported.nr_devices}")


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
        if _dir is None or jax.device_count() != 1 or jax.config.jax_disable_jit:
            return None
        static, names, values = self._split(args, kwargs)
        leaves, in_tree = jax.tree.flatten(values)
        avals = [_aval(x) for x in leaves]
        if any(a is None for a in avals):
            return None
        shapes = tuple((a.shape, a.dtype, a.weak_type) for a in avals)
        # In memory, the static values themselves (hashable, as jit requires): no repr per call.
        memo = (
            in_tree, shapes, tuple(static[k] for k in sorted(static)),
            tuple(getattr(jax.config, n) for n in _CONFIG_LIVE),
        )  # fmt: skip
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

    def key(self, static: dict, in_tree: Any, avals: list) -> str:
        """The entry's key (module doc) for a call's static arguments, tree and shapes."""
        parts = {
            "format": FORMAT,
            "function": f"{self.fun.__module__}."
            f"{getattr(self.fun, '__qualname__', fingerprint(self.fun))}",
            "partial": fingerprint(self.fun) if isinstance(self.fun, functools.partial) else "",
            "static": sorted([k, fingerprint(v)] for k, v in static.items()),
            "in_tree": tree_to_json(in_tree),
            "avals": _avals_json(avals),
            "source": _source_hash(_roots(self.fun)),
            "context": context(),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _load_or_trace(
        self, static: dict, names: list[str], values: list, in_tree: Any, avals: list
    ) -> _Entry:
        donate = self._donated_leaves(names, values)
        key = self.key(static, in_tree, avals)
        path = _dir / f"{_name(self.fun)}-{key}{SUFFIX}"
        try:
            return self._load(path, key, in_tree, avals, donate)
        except FileNotFoundError:
            pass  # not saved yet
        except Exception as e:  # (anything a damaged entry raises while read or rebuilt)
            log.warning("kept trace %s is unusable (%s): tracing it anew", path.name, e)
        exported, out_tree = self._export(static, names, in_tree, avals)
        header = {
            "key": key, "function": _name(self.fun), "in_tree": tree_to_json(in_tree),
            "avals": _avals_json(avals),
        }  # fmt: skip
        try:
            header["out_tree"] = tree_to_json(out_tree)
        except TypeError as e:  # a result tree that plain data cannot name: not kept
            log.warning("not keeping the trace of %s: %s", _name(self.fun), e)
        else:
            _save(path, encode(header, exported.serialize()))
        return _Entry(exported, out_tree, donate)

    def _load(
        self, path: pathlib.Path, key: str, in_tree: Any, avals: list, donate: tuple
    ) -> _Entry:
        """The entry kept at `path`, checked against this call (Unusable: why not)."""
        header, payload = decode(read(path), key)
        if header.get("in_tree") != tree_to_json(in_tree):
            raise Unusable("its argument tree is not the call's")
        if header.get("avals") != _avals_json(avals):
            raise Unusable("its argument shapes are not the call's")
        out_tree = tree_from_json(header.get("out_tree"))
        for hook in _before_load:
            hook()
        exported = jax.export.deserialize(bytearray(payload))
        _check_exported(exported, avals, out_tree)
        _touch(path)
        return _Entry(exported, out_tree, donate)

    def _export(self, static: dict, names: list[str], in_tree: Any, avals: list) -> tuple:
        """Trace the function on the flat leaves and export it; returns (Exported, out tree)."""
        box: dict[str, Any] = {}

        def flat(*leaves: Any) -> list:
            values = jax.tree.unflatten(in_tree, leaves)
            out = self.fun(**static, **dict(zip(names, values, strict=True)))
            out_leaves, box["tree"] = jax.tree.flatten(out)
            return out_leaves

        checks = [jax.export.DisabledSafetyCheck.custom_call(n) for n in sorted(CUSTOM_CALLS)]
        exported = jax.export.export(jax.jit(flat), disabled_checks=checks)(*avals)
        return exported, box["tree"]


def _name(fun: Callable) -> str:
    base = fun.func if isinstance(fun, functools.partial) else fun
    return getattr(base, "__name__", "fn")


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
