"""jaxspec.trace_cache: a saved trace is loaded instead of tracing again, gives the same bits
as `jax.jit`, and is never used for another function, static argument or shape."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import trace_cache
from jaxspec.config import LlamaConfig
from jaxspec.model import Llama, init_cache, init_params
from verify.step import prefill_fn

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
    from jaxspec.model import Model
    from jaxspec.protocol import DraftSpec
    from jaxspec.sampling import SamplingParams, session_key
    from jaxspec.testing import tiny_config

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
