"""jaxspec.compilation.trace_cache: a saved trace is loaded instead of tracing again, gives the
same bits as `jax.jit`, and is never used for another function, static argument, shape, JAX
setting or kernel build; a damaged, misplaced or planted entry is traced anew (never a crash,
never code run); a directory others can write is not used; old entries are evicted."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import kernels
from jaxspec.compilation import trace_cache
from jaxspec.kernels import dense as floatkernel
from jaxspec.nn.config import LlamaConfig
from jaxspec.nn.model import Llama, init_cache, init_params
from jaxspec_host import xla_cache
from verify.step import prefill_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRACED: list[str] = []  # one entry per Python trace of `scaled`


def scaled(x: jax.Array, y: jax.Array, *, power: int) -> tuple[jax.Array, dict]:
    TRACED.append(f"{x.shape}/{power}")
    return x**power + y, {"sum": jnp.sum(x)}


@pytest.fixture
def cache_dir(tmp_path):
    trace_cache.configure(tmp_path)
    TRACED.clear()
    yield tmp_path
    trace_cache.configure(None)


def _fresh():
    """What a new process builds: a new wrapper and no trace in JAX's memory, same disk."""
    jax.clear_caches()
    return trace_cache.jit(scaled, static_argnames=("power",), donate_argnums=(1,))


def _entries(directory) -> list:
    """The kept entries (not a writer's temporary file), oldest first."""
    found = [p for p in directory.iterdir() if not p.name.startswith(".")]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns)


def _same(got, want) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture
def jax_cache_settings():
    """`configure_compilation_cache` sets JAX's global cache settings: put them back."""
    names = (
        "jax_enable_compilation_cache", "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
    )  # fmt: skip
    saved = {n: getattr(jax.config, n) for n in names}
    yield
    for n, v in saved.items():
        jax.config.update(n, v)
    trace_cache.configure(None)


def test_a_second_process_loads_the_trace_instead_of_tracing(cache_dir):
    x = jnp.arange(6.0).reshape(2, 3)
    out = _fresh()(x, jnp.ones((2, 3)), power=3)
    assert TRACED == ["(2, 3)/3"] and len(list(cache_dir.iterdir())) == 1
    again = _fresh()(x, jnp.ones((2, 3)), power=3)
    assert TRACED == ["(2, 3)/3"]  # loaded: the Python body did not run
    want = jax.jit(scaled, static_argnames=("power",))(x, jnp.ones((2, 3)), power=3)
    for a, b, c in zip(*(jax.tree.leaves(t) for t in (out, again, want)), strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)


def test_another_static_argument_or_shape_is_traced_anew(cache_dir):
    f = _fresh()
    f(jnp.ones(3), jnp.ones(3), power=2)
    f(jnp.ones(3), jnp.ones(3), power=3)  # another static argument
    f(jnp.ones(4), jnp.ones(4), power=2)  # another shape
    f(jnp.ones(4, jnp.int32), jnp.ones(4, jnp.int32), power=2)  # another dtype
    assert len(TRACED) == 4 and len(list(cache_dir.iterdir())) == 4
    np.testing.assert_array_equal(_fresh()(jnp.ones(3), jnp.ones(3), power=3)[0], 2.0)
    assert len(TRACED) == 4  # each was kept under its own key


def test_a_key_without_the_static_argument_would_be_caught(cache_dir, monkeypatch):
    """Mutant: a key that forgets the static arguments serves power 2's trace for power 3;
    the check above (a new trace per static argument) sees it."""
    monkeypatch.setattr(trace_cache, "fingerprint", lambda obj: "same")
    f = _fresh()
    f(jnp.ones(3), jnp.ones(3), power=2)
    out = _fresh()(jnp.asarray(np.full(3, 2.0, np.float32)), jnp.zeros(3), power=3)[0]
    assert len(TRACED) == 1 and float(out[0]) == 4.0  # wrong: 2**2, where 2**3 = 8 was asked


def test_an_unreadable_trace_is_traced_again(cache_dir):
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    (path,) = cache_dir.iterdir()
    path.write_bytes(b"truncated")
    out = _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert len(TRACED) == 2 and float(out[0][0]) == 2.0


def test_off_without_a_directory():
    trace_cache.configure(None)
    TRACED.clear()
    f = _fresh()
    f(jnp.ones(2), jnp.ones(2), power=2)
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert len(TRACED) == 2  # plain jax.jit: every new wrapper traces


def test_the_verifier_prefill_gives_the_same_cache_bits(cache_dir):
    """A model program (Flax, our kernels where built, a donated cache): loaded from disk in
    a fresh wrapper, the same bits as jax.jit."""
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    module, params = Llama(cfg), init_params(cfg, 0)
    toks = jnp.asarray([[3, 5, 7, 9]], jnp.int32)
    args = (toks, jnp.arange(4, dtype=jnp.int32)[None], toks > 0, jnp.zeros(1, jnp.int32))
    plain = jax.jit(functools.partial(prefill_fn, module))(params, init_cache(cfg, 2, 8), *args)
    for _ in range(2):  # traced and saved, then loaded
        f = trace_cache.jit(functools.partial(prefill_fn, module), donate_argnums=(1,))
        got = f(params, init_cache(cfg, 2, 8), *args)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(list(cache_dir.iterdir())) == 1


def test_a_loaded_trace_donates_what_jit_would(cache_dir):
    """Donation by name or position survives the cache: the donated input is consumed (the
    KV cache written in place), traced or loaded."""
    for on in (False, True, True):  # plain jit; traced and saved; loaded in a fresh wrapper
        trace_cache.configure(cache_dir if on else None)
        jax.clear_caches()
        f = trace_cache.jit(scaled, static_argnames=("power",), donate_argnames=("y",))
        x, y = jnp.ones(4), jnp.ones(4)
        f(x, y, power=2)
        assert y.is_deleted() and not x.is_deleted()
    assert len(TRACED) == 2


def test_an_edge_drafter_round_is_the_same_from_a_kept_trace(cache_dir):
    """The drafter's jitted functions (prefill, the donated round) through kept traces: the
    same drafts and state as with the cache off."""
    from edge.drafter import Drafter
    from jaxspec.ckpts.tiny import tiny_config
    from jaxspec.decoding.sampling import SamplingParams, session_key
    from jaxspec.nn.model import Model
    from jaxspec.protocol import DraftSpec

    cfg = tiny_config()
    model = Model(config=cfg, params=init_params(cfg, 3))
    drafter = Drafter(model, DraftSpec(gamma=3, encoding="full"))

    def run():
        jax.clear_caches()
        st = drafter.prefill(drafter.init(2, 64), [[1, 2, 3, 4, 5]])
        keys = jnp.stack([session_key(7, 0)] * 2)
        sampling = SamplingParams.make(2, 0.8)
        st, blk = drafter.draft(st, sampling, keys)
        st, again = drafter.round(st, [6, 0], [[9], [0]], [1, 0], sampling, keys)  # donated
        return jax.tree.leaves((st, blk, again))

    kept = [run(), run()]  # traced and saved, then loaded
    trace_cache.configure(None)
    plain = run()
    assert len(list(cache_dir.iterdir())) >= 2
    for got in kept:
        for a, b in zip(got, plain, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- damaged, misplaced and planted entries: traced anew, never a crash, never code run -----


def test_a_flipped_bit_anywhere_is_traced_anew_and_rewritten(cache_dir):
    """16 single-bit flips spread over the entry (head, header, program, checksum): each is
    traced anew (the Python body runs), gives jax.jit's bits, and is rewritten, so the next
    fresh process loads it again. (Before: a flip in the program crashed the command with
    `Failed to deserialize StableHLO`, or was loaded as a changed program.)"""
    x, y = jnp.arange(3.0), jnp.ones(3)
    want = jax.jit(scaled, static_argnames=("power",))(x, y, power=2)
    TRACED.clear()
    _same(_fresh()(x, jnp.ones(3), power=2), want)
    (path,) = _entries(cache_dir)
    good = path.read_bytes()
    for i, pos in enumerate(np.linspace(0, len(good) - 1, 16).astype(int)):
        bad = bytearray(good)
        bad[pos] ^= 1 << (i % 8)
        path.write_bytes(bytes(bad))
        _same(_fresh()(x, jnp.ones(3), power=2), want)
        assert len(TRACED) == 2 + i, f"a flip at byte {pos} of {len(good)} was loaded"
        _same(_fresh()(x, jnp.ones(3), power=2), want)  # rewritten: loaded, not traced
        assert len(TRACED) == 2 + i and _entries(cache_dir) == [path]


def test_an_entry_stored_under_another_key_is_traced_anew(cache_dir):
    """Shape (3,)'s entry in the place of shape (4,)'s: traced anew and rewritten, where it
    raised `ValueError: Shape mismatch`. And an entry whose header names the right key but
    holds another call's tree and shapes is refused by the check against the call."""
    f = _fresh()
    f(jnp.ones(3), jnp.ones(3), power=2)
    (three,) = _entries(cache_dir)
    f(jnp.ones(4), jnp.ones(4), power=2)
    (four,) = set(_entries(cache_dir)) - {three}
    four.write_bytes(three.read_bytes())
    out = _fresh()(jnp.ones(4), jnp.ones(4), power=2)
    assert len(TRACED) == 3 and out[0].shape == (4,) and float(out[0][0]) == 2.0
    _fresh()(jnp.ones(4), jnp.ones(4), power=2)
    assert len(TRACED) == 3  # rewritten under its own key

    key = four.name.removesuffix(trace_cache.SUFFIX).rsplit("-", 1)[1]
    old_key = three.name.removesuffix(trace_cache.SUFFIX).rsplit("-", 1)[1]
    header, payload = trace_cache.decode(three.read_bytes(), old_key)
    four.write_bytes(trace_cache.encode({**header, "key": key}, payload))  # a sound checksum
    out = _fresh()(jnp.ones(4), jnp.ones(4), power=2)
    assert len(TRACED) == 4 and out[0].shape == (4,)


class _RunsACommand:
    """What a pickle can do when loaded: run a command (here, create a marker file)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_in_place_of_an_entry_runs_nothing(cache_dir, tmp_path_factory):
    """A kept entry is data: a pickle that runs a command, put in an entry's place, is not a
    trace (no magic) and is traced anew; the command never ran (before: it ran)."""
    marker = tmp_path_factory.mktemp("marker") / "ran"
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    (path,) = _entries(cache_dir)
    path.write_bytes(pickle.dumps(_RunsACommand(marker)))
    out = _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert not marker.exists(), "loading a kept trace ran a command"
    assert len(TRACED) == 2 and float(out[0][0]) == 2.0


def test_a_directory_or_entry_others_can_write_is_not_used(tmp_path, caplog, jax_cache_settings):
    """Group/world-writable or another user's: a warning, and neither kept traces nor
    compiled executables from it (either would run in this process). An entry file that is
    not ours alone is traced anew. Before: used as any other."""
    traces = tmp_path / "traces"
    traces.mkdir()
    traces.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert trace_cache.configure(traces) is None
    assert "writable by group or others (mode 777)" in caplog.text
    xla = tmp_path / "xla"
    xla.mkdir()
    xla.chmod(0o775)
    assert xla_cache.configure_compilation_cache(str(xla)) is None
    assert trace_cache.directory() is None and not jax.config.jax_enable_compilation_cache

    traces.chmod(0o700)
    trace_cache.configure(traces)
    TRACED.clear()
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    (path,) = _entries(traces)
    path.chmod(0o666)
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert len(TRACED) == 2  # the writable entry was not loaded, but traced and rewritten
    assert trace_cache.foreign_writers(path) == ""
    if os.geteuid() == 0:  # (only root can give a file away)
        os.chown(path, 65534, 65534)
        _fresh()(jnp.ones(2), jnp.ones(2), power=2)
        assert len(TRACED) == 3
        os.chown(traces, 65534, 65534)
        assert trace_cache.configure(traces) is None
        assert "owned by uid 65534" in caplog.text


def test_a_traces_file_in_the_cache_directory_is_a_warning(tmp_path, caplog, jax_cache_settings):
    """`traces` a file, not a directory: the compilation cache is used, kept traces are off
    with a warning. Before: `configure_compilation_cache` raised FileExistsError."""
    (tmp_path / "traces").write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        assert xla_cache.configure_compilation_cache(str(tmp_path)) == str(tmp_path)
    assert trace_cache.directory() is None and "kept traces are off" in caplog.text


CHILD = """
import sys
import jax.numpy as jnp
from jaxspec.compilation import trace_cache
from jaxspec_host.xla_cache import configure_compilation_cache

def double(x):
    print("traced", flush=True)
    return x * 2

print("cache", configure_compilation_cache(sys.argv[1]), trace_cache.directory(), flush=True)
print("result", float(trace_cache.jit(double)(jnp.ones(2))[0]), flush=True)
"""


def _run_read_only(directory, script) -> subprocess.CompletedProcess:
    """`python script directory` with `directory` read-only: a read-only bind mount in a
    mount namespace of its own as root (mode bits do not stop root), mode 555 otherwise."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, str(script), str(directory)]
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        finally:
            directory.chmod(0o700)
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare: no way to make a directory read-only")
    mount = f"mount --bind -o ro {directory} {directory} && exec {' '.join(cmd)}"
    wrapped = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount]
    out = subprocess.run(wrapped, env=env, capture_output=True, text=True, timeout=300)
    if "mount" in out.stderr and out.returncode != 0 and "result" not in out.stdout:
        pytest.skip(f"cannot mount read-only here: {out.stderr.strip()[-200:]}")
    return out


def test_a_read_only_cache_directory_is_a_warning_not_an_error(tmp_path):
    """A read-only cache directory without `traces/`: a warning, the command runs (traces and
    compiles without it). With `traces/` kept by an earlier run: loaded, nothing written.
    Before: `[Errno 30] Read-only file system` ended the command."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    out = _run_read_only(cache, script)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "result 2.0" in out.stdout and "traced" in out.stdout
    assert "kept traces are off" in out.stderr and "read-only" in out.stderr
    assert list(cache.iterdir()) == []

    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, str(script), str(cache)], env=env, check=True, timeout=300)
    kept = sorted((cache / "traces").iterdir())
    out = _run_read_only(cache, script)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "result 2.0" in out.stdout and "traced" not in out.stdout  # loaded
    assert sorted((cache / "traces").iterdir()) == kept


# --- the key ------------------------------------------------------------------------------


def noisy(key: jax.Array, x: jax.Array) -> jax.Array:
    """A program whose numbers depend on JAX settings: random bits and a matmul."""
    TRACED.append("noisy")
    return jax.random.uniform(key, (8,)) + jnp.dot(x, x)


@pytest.mark.parametrize(
    "name, first, then",
    [
        ("jax_threefry_partitionable", False, True),
        ("jax_default_matmul_precision", None, "highest"),
        ("jax_numpy_dtype_promotion", "standard", "strict"),
    ],
)
def test_a_jax_setting_that_changes_the_program_is_in_the_key(cache_dir, name, first, then):
    """A trace kept under one setting is not loaded under another: traced anew, jax.jit's
    numbers. Before: JAX_THREEFRY_PARTITIONABLE=0's trace was loaded by a default process,
    which then drew other numbers than with the cache off."""
    key, x = jax.random.PRNGKey(3), jnp.arange(8.0)
    saved = getattr(jax.config, name)
    try:
        jax.config.update(name, first)
        jax.clear_caches()
        same_wrapper = trace_cache.jit(noisy)
        same_wrapper(key, x)
        jax.config.update(name, then)
        jax.clear_caches()
        got = trace_cache.jit(noisy)(key, x)
        assert TRACED == ["noisy", "noisy"], f"{name}={then} loaded the {first} trace"
        np.testing.assert_array_equal(got, jax.jit(noisy)(key, x))
        same_wrapper(key, x)  # one process whose setting changed: looked up again, loaded
        assert TRACED == ["noisy", "noisy", "noisy"] and len(_entries(cache_dir)) == 2
    finally:
        jax.config.update(name, saved)


def test_the_kernels_and_their_built_library_are_in_the_key(cache_dir, monkeypatch):
    """The kernel modules register what they add to every key: the built library's sha256
    ("absent" where it is not loaded) and whether the float kernel is used. A trace kept with
    one value is not served with another (a library built later, a missing one)."""
    parts = trace_cache.key_parts()
    if kernels.available():
        (lib,) = sorted(p for p in os.listdir(os.path.dirname(kernels.__file__))
                        if p.startswith("_cpu") and p.endswith(".so"))  # fmt: skip
        with open(os.path.join(os.path.dirname(kernels.__file__), lib), "rb") as f:
            assert parts["kernel_lib"] == hashlib.sha256(f.read()).hexdigest()
    else:
        assert parts["kernel_lib"] == "absent"
    assert parts["float_kernel"] == ("on" if floatkernel.enabled() else "off")
    monkeypatch.setenv("JAXSPEC_FLOAT_KERNEL", "0")
    assert trace_cache.key_parts()["float_kernel"] == "off"

    library = {"sha256": "before"}
    trace_cache.key_part("test library", lambda: library["sha256"])
    try:
        _fresh()(jnp.ones(2), jnp.ones(2), power=2)
        library["sha256"] = "rebuilt"
        _fresh()(jnp.ones(2), jnp.ones(2), power=2)
        assert len(TRACED) == 2
        library["sha256"] = "before"
        _fresh()(jnp.ones(2), jnp.ones(2), power=2)
        assert len(TRACED) == 2 and len(_entries(cache_dir)) == 2
    finally:
        trace_cache.key_part("test library", None)


def test_secrets_in_the_environment_are_not_in_the_key(cache_dir, monkeypatch):
    """A token or API key rotated: the kept traces are loaded, nothing traced again (before:
    every JAXSPEC_* variable was in the key). A variable that changes the program
    (JAXSPEC_FLOAT_KERNEL) still is."""
    for i in range(3):
        monkeypatch.setenv("JAXSPEC_TOKEN", f"token-{i}")
        monkeypatch.setenv("JAXSPEC_API_KEY", f"key-{i}")
        _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert len(TRACED) == 1 and len(_entries(cache_dir)) == 1
    monkeypatch.setenv("JAXSPEC_FLOAT_KERNEL", "0")
    _fresh()(jnp.ones(2), jnp.ones(2), power=2)
    assert len(TRACED) == 2


def test_least_recently_used_entries_are_evicted_beyond_the_bound(tmp_path, monkeypatch):
    """Beyond `max_bytes` the entries used longest ago go (a load counts as a use); the bound
    comes from $JAXSPEC_TRACE_CACHE_MB in the commands."""
    trace_cache.configure(tmp_path)
    TRACED.clear()
    _fresh()(jnp.ones(1), jnp.ones(1), power=2)
    size = _entries(tmp_path)[0].stat().st_size
    trace_cache.configure(tmp_path, max_bytes=3 * size + size // 2)  # room for three
    by_shape = {}
    for n in (1, 2, 3):
        _fresh()(jnp.ones(n), jnp.ones(n), power=2)
        (by_shape[n],) = set(_entries(tmp_path)) - set(by_shape.values())
        os.utime(by_shape[n], (1000.0 * n, 1000.0 * n))  # used in this order, long ago
    _fresh()(jnp.ones(1), jnp.ones(1), power=2)  # loaded: now the most recently used
    assert len(TRACED) == 3
    _fresh()(jnp.ones(4), jnp.ones(4), power=2)  # one too many: the oldest (2) goes
    assert len(TRACED) == 4
    left = set(_entries(tmp_path))
    assert by_shape[1] in left and by_shape[3] in left and by_shape[2] not in left
    assert len(left) == 3
    trace_cache.configure(None)

    monkeypatch.setenv("JAXSPEC_TRACE_CACHE_MB", "2")
    assert xla_cache.trace_budget() == 2 << 20
    monkeypatch.setenv("JAXSPEC_TRACE_CACHE_MB", "lots")
    assert xla_cache.trace_budget() == trace_cache.DEFAULT_MAX_BYTES


FRESH_PROCESS = """
import sys
import jax.numpy as jnp
import numpy as np
from jaxspec import kernels
from jaxspec.compilation import trace_cache
from jaxspec.kernels import dense as floatkernel

def project(x, w):
    print("traced", flush=True)
    return floatkernel.matmul(x, w)

trace_cache.configure(sys.argv[1])
x = jnp.arange(8.0, dtype=jnp.float32).reshape(2, 4)
out = trace_cache.jit(project)(x, jnp.ones((4, 3), jnp.float32))
print("result", np.asarray(out).tolist(), flush=True)
"""


@pytest.mark.skipif(not kernels.available(), reason="the FFI kernels are not built")
def test_a_fresh_process_loads_a_kernel_trace_before_tracing_anything(tmp_path):
    """A process that has traced nothing (so registered no FFI handler by tracing) loads a
    kept program that calls our float kernel: the kernels register before the load (the
    `before_load` hooks and the key parts), and it gives the tracing process's numbers.
    Without the hooks the load fails: "No FFI handler registered"."""
    script = tmp_path / "fresh.py"
    script.write_text(textwrap.dedent(FRESH_PROCESS))
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, str(script), str(tmp_path / "traces")]
    runs = [
        subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300) for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert "traced" in runs[0].stdout and "traced" not in runs[1].stdout
    result = [line for line in runs[0].stdout.splitlines() if line.startswith("result")]
    assert result and result[0] in runs[1].stdout.splitlines()
    (entry,) = (tmp_path / "traces").iterdir()
    assert b"jaxspec_float_matmul" in entry.read_bytes()  # the kept program calls the kernel


def test_compiled_programs_are_dropped_near_the_maps_limit():
    """Each compiled executable maps its code apart: past half the kernel's memory maps
    `bound_compiled_programs` drops what JAX keeps (a bench run reached 63,170 of 65,530, and
    XLA then dies allocating section memory); below it, nothing is dropped."""
    maps = xla_cache.memory_maps()
    if maps is None:
        pytest.skip("no /proc here: the process's memory maps cannot be counted")
    f = jax.jit(lambda x: x * 2 + 1)
    for n in range(1, 41):  # forty programs of their own
        f(jnp.zeros(n))
    held = xla_cache.memory_maps()[0]
    assert not xla_cache.bound_compiled_programs()  # far below half the limit
    assert xla_cache.bound_compiled_programs(share=held / maps[1] / 2)
    assert xla_cache.memory_maps()[0] < held  # their code is unmapped
    assert float(f(jnp.ones(3))[0]) == 3.0  # and compiles again on use
