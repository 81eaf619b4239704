"""The JAX model against transformers' torch implementation, and the cache contract."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import jaxspec
from tests.fixtures import config_variants

VARIANTS = list(config_variants())
TOL = 1e-4


def hf_logits(oracle, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return oracle(torch.tensor(np.asarray(ids)[None])).logits[0].numpy()


@pytest.fixture(scope="module")
def loaded(hf_checkpoints):
    return {name: (jaxspec.load(d), oracle) for name, (d, oracle) in hf_checkpoints.items()}


@pytest.mark.parametrize("name", VARIANTS)
def test_prefill_and_stepwise_decode_match_transformers(loaded, name):
    model, oracle = loaded[name]
    ids = np.random.RandomState(1).randint(0, model.config.vocab_size, (2, 24))
    ref = np.stack([hf_logits(oracle, r) for r in ids])
    pos = np.broadcast_to(np.arange(24), ids.shape)

    logits, cache = model(ids, pos, model.init_cache(2, 32))
    assert np.abs(np.asarray(logits) - ref).max() < TOL
    assert cache.lengths.tolist() == [24, 24]

    # Prefill 10, verify a block of 6, then single-token steps: all equal one full forward.
    cache = model.init_cache(2, 32)
    got = []
    for lo, hi in [(0, 10), (10, 16), *[(t, t + 1) for t in range(16, 24)]]:
        logits, cache = model(ids[:, lo:hi], pos[:, lo:hi], cache)
        got.append(np.asarray(logits))
    assert np.abs(np.concatenate(got, axis=1) - ref).max() < TOL


@pytest.mark.parametrize("name", ["gqa", "mqa_tied", "qwen2"])
def test_padded_ragged_batch_matches_transformers(loaded, name):
    model, oracle = loaded[name]
    rng = np.random.RandomState(2)
    lengths = [3, 17, 9, 1]
    tokens = np.zeros((4, 20), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.randint(0, model.config.vocab_size, n)
    pos = np.broadcast_to(np.arange(20), tokens.shape)
    valid = pos < np.asarray(lengths)[:, None]
    logits, cache = model(tokens, pos, model.init_cache(4, 24), valid=valid)
    assert cache.lengths.tolist() == lengths
    for i, n in enumerate(lengths):
        ref = hf_logits(oracle, tokens[i, :n])
        assert np.abs(np.asarray(logits)[i, :n] - ref).max() < TOL
    # One more token per row, each at its own position, continues every row correctly.
    nxt = rng.randint(0, model.config.vocab_size, 4)
    logits, cache = model(nxt[:, None], np.asarray(lengths)[:, None], cache)
    for i, n in enumerate(lengths):
        ref = hf_logits(oracle, np.append(tokens[i, :n], nxt[i]))[-1]
        assert np.abs(np.asarray(logits)[i, 0] - ref).max() < TOL


@given(
    keep=st.integers(1, 15),
    seed=st.integers(0, 2**16),
)
def test_rolled_back_row_equals_one_never_rolled_back(loaded, keep, seed):
    """Decode 16 tokens, roll row 0 back to `keep`, decode other tokens there: equal to a
    fresh decode of the same final sequence (row 1, untouched, is unaffected)."""
    model, _ = loaded["gqa"]
    rng = np.random.RandomState(seed)
    V = model.config.vocab_size
    first = rng.randint(0, V, (2, 16))
    redo = rng.randint(0, V, (2, 16 - keep))
    pos = np.broadcast_to(np.arange(16), (2, 16))
    _, cache = model(first, pos, model.init_cache(2, 16))
    cache = cache.rollback(jnp.array([0]), jnp.array([keep]))
    assert cache.lengths.tolist() == [keep, 16]
    # Row 0 re-decodes positions keep..15; row 1 sends padding (valid=False) only.
    valid = np.array([[True] * (16 - keep), [False] * (16 - keep)])
    logits, cache = model(redo, pos[:, keep:], cache, valid=valid)

    final = np.concatenate([first[0, :keep], redo[0]])
    ref, fresh_cache = model(final[None], pos[:1], model.init_cache(1, 16))
    assert np.abs(np.asarray(logits)[0] - np.asarray(ref)[0, keep:]).max() < 1e-5
    assert cache.lengths.tolist() == [16, 16]
    np.testing.assert_allclose(cache.k[:, 0], fresh_cache.k[:, 0], atol=1e-5)
    # The padded row's cache was not touched.
    _, untouched = model(first, pos, model.init_cache(2, 16))
    np.testing.assert_array_equal(cache.k[:, 1], untouched.k[:, 1])


def test_slots_address_rows_of_a_larger_pool(loaded):
    """A batch may address arbitrary slots of a pool (the verifier's KV slot pool)."""
    model, oracle = loaded["gqa"]
    ids = np.random.RandomState(3).randint(0, model.config.vocab_size, (2, 8))
    pos = np.broadcast_to(np.arange(8), ids.shape)
    pool = model.init_cache(5, 16)
    logits, pool = model(ids, pos, pool, slots=jnp.array([3, 1]))
    assert pool.lengths.tolist() == [0, 8, 0, 8, 0]
    assert np.abs(np.asarray(logits)[0] - hf_logits(oracle, ids[0])).max() < TOL
    assert np.abs(np.asarray(logits)[1] - hf_logits(oracle, ids[1])).max() < TOL
    assert not np.any(np.asarray(pool.k[:, [0, 2, 4]]))


def test_param_count_matches_transformers(loaded):
    for name, (model, oracle) in loaded.items():
        assert model.num_params() == sum(p.numel() for p in oracle.parameters()), name
        assert model.config.num_params == model.num_params(), name
        assert model.nbytes() == 4 * model.num_params()


@pytest.mark.parametrize("name", sorted(config_variants()))
def test_param_shapes_are_what_init_params_makes(name):
    """`param_shapes` (what `jaxspec.load` checks tensors against, read from the config) is
    the tree, shapes and dtypes that tracing `init_params` gives, for every architecture."""
    import jax

    cfg = config_variants()[name]
    got = jaxspec.nn.model.param_shapes(cfg)
    want = jax.eval_shape(lambda: jaxspec.init_params(cfg))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.leaves(got) == jax.tree.leaves(want)
