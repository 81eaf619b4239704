"""The edge drafter: rollback + re-draft equals a fresh drafter, position-keyed draws, and the
q of every encoding is the distribution the drafts were sampled from; the quality tool
(tools/quality_w4a16.py: perplexity, acceptance, resident bytes, drafter speed) end to end."""

from __future__ import annotations

import ast
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from edge.drafter import DraftBatch, Drafter
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.decoding.sampling import Purpose, SamplingParams, sample, session_keys, uniforms, warp
from jaxspec.decoding.speculative import draft_block
from jaxspec.protocol import DraftSpec
from tests.tool_scripts import load_tool

ENCODINGS = ("full", "sparse", "onehot")
GAMMA, SPARSE_K = 4, 5
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def model():
    """A W4A16 draft (the edge's format) with weights spread far from uniform."""
    cfg = tiny_config(tie_word_embeddings=True)
    params = jax.tree.map(lambda a: 3 * a, jaxspec.init_params(cfg, 0))
    return jaxspec.quantize(jaxspec.Model(config=cfg, params=params), "w4a16", 16, method="rtn")


@pytest.fixture(scope="module")
def drafters(model):
    return {
        e: Drafter(model, DraftSpec(gamma=GAMMA, encoding=e, sparse_k=SPARSE_K)) for e in ENCODINGS
    }


def sampling(rows, temperature=1.0):
    return SamplingParams.make(rows, temperature=temperature)


def fresh(d, prompts, rows=None, max_len=48):
    return d.prefill(d.init(len(prompts) if rows is None else rows, max_len), prompts)


def assert_same_state(a, b):
    np.testing.assert_array_equal(a.length, b.length)
    np.testing.assert_array_equal(a.cache.lengths, b.cache.lengths)
    for r, (n, kv) in enumerate(
        zip(np.asarray(a.length), np.asarray(a.cache.lengths), strict=True)
    ):
        np.testing.assert_array_equal(a.tokens[r, :n], b.tokens[r, :n])
        for x, y in ((a.cache.k, b.cache.k), (a.cache.v, b.cache.v)):
            np.testing.assert_allclose(x[:, r, :kv], y[:, r, :kv], atol=1e-5, rtol=0)


def assert_same_q(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("pipelined", [False, True])
def test_rollback_and_redraft_equals_a_fresh_drafter(drafters, encoding, pipelined):
    d = drafters[encoding]
    sp, keys = sampling(2), session_keys(0, 2)
    st, b1 = d.draft(fresh(d, PROMPTS), sp, keys)
    if pipelined:  # a second block in flight when block 1's verdict arrives
        st, _ = d.draft(st, sp, keys)
    # Row 0 accepted 2 drafts + a correction; row 1 all 4 + a bonus: in sync mode its KV then
    # lags two positions behind (its last draft was never fed).
    st = d.rollback(st, [0, 1], [3 + 2, 5 + 4])
    st = d.append(st, [0, 1], [[9], [11]])
    assert np.asarray(st.length - st.cache.lengths).tolist() == [1, 1 if pipelined else 2]
    st, got = d.draft(st, sp, keys)

    committed = [
        PROMPTS[0] + np.asarray(b1.tokens[0, :2]).tolist() + [9],
        PROMPTS[1] + np.asarray(b1.tokens[1]).tolist() + [11],
    ]
    ref_state, ref = d.draft(fresh(d, committed), sp, keys)
    np.testing.assert_array_equal(got.start, [6, 10])
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    assert_same_q(got.q, ref.q)
    assert_same_state(st, ref_state)


@pytest.mark.parametrize("encoding", ["full", "sparse"])
def test_a_round_is_rollback_append_and_draft_in_one_donated_call(drafters, encoding):
    """`round` = rollback + append + draft, bit for bit (state and drafts), per row (row 0
    rolls back and takes a token, row 1 is kept whole and takes none); its input state is
    donated: JAX refuses it afterwards, so no caller can read a state the round reused."""
    d = drafters[encoding]
    sp, keys = sampling(2), session_keys(4, 2)
    st, _ = d.draft(fresh(d, PROMPTS), sp, keys)
    ref = d.draft(d.append(d.rollback(st, [0], [4]), [0], [[9]]), sp, keys, gamma=3)
    got = d.round(st, [4, 99], [[9], [0]], [1, 0], sp, keys, gamma=3)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got[1].start, [5, len(PROMPTS[1]) + GAMMA])
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(st.cache.k)
    with pytest.raises(ValueError, match=r"1\.\.4"):
        d.round(got[0], [4, 4], [[0], [0]], [0, 0], sp, keys, gamma=5)


class _ForwardSpy:
    """A draft module stand-in for `draft_block`: records the width of every forward as it is
    traced and as it runs (a host callback per run)."""

    def __init__(self, module):
        self.module, self.config, self.dtype = module, module.config, module.dtype
        self.traced, self.ran = [], []

    def apply(self, variables, tokens_BT, *args):
        width = tokens_BT.shape[1]
        self.traced.append(width)
        jax.debug.callback(lambda: self.ran.append(width))
        return self.module.apply(variables, tokens_BT, *args)


def test_a_block_runs_gamma_forwards_the_first_two_wide_where_a_row_lags(model):
    """A block of gamma drafts runs gamma forwards of one position each (`last`, then each
    draft) when no row's KV lags by two; when a row's does, still gamma forwards, the first
    two positions wide (`prev` and `last`), never a separate forward for `prev`."""
    spy = _ForwardSpy(model.module)
    spec = DraftSpec(gamma=GAMMA, encoding="full")
    st = fresh(Drafter(model, spec), PROMPTS)
    sp, keys = sampling(2), session_keys(3, 2)

    @jax.jit
    def block(cache, feed_prev):
        prev, last, n = jnp.array([2, 7]), jnp.array([3, 8]), jnp.array([3, 5])
        return draft_block(
            spy, model.params, cache, prev, last, n, feed_prev, jnp.array([True, True]), sp,
            keys, spec=spec,
        )  # fmt: skip

    block(st.cache, jnp.array([False, False]))[0].block_until_ready()
    assert set(spy.traced) == {1, 2} and spy.ran == [1] * GAMMA
    spy.ran.clear()
    block(st.cache, jnp.array([False, True]))[0].block_until_ready()
    assert spy.ran == [2] + [1] * (GAMMA - 1)


@pytest.mark.parametrize("encoding", ["full", "sparse"])
def test_prev_fed_in_the_first_forward_drafts_the_bits_of_feeding_it_alone(drafters, encoding):
    """A lagging row's block (prev fed in the two-wide first forward) drafts the very bits,
    q included, that feeding prev in a forward of its own and then drafting gives: the
    kernels are batch-invariant across a forward's positions. The mutant that leaves prev
    unfed (its KV missing) drafts otherwise, so the comparison can fail."""
    d = drafters[encoding]
    model = d.model
    st = fresh(d, PROMPTS)
    sp, keys, live = sampling(2), session_keys(5, 2), jnp.array([True, True])
    rows, n = jnp.arange(2), st.length  # the prompt's KV is written below n - 1
    prev, last = st.tokens[rows, n - 2], st.tokens[rows, n - 1]
    c = st.cache  # lagging by two: prev's KV (at n - 2) missing
    lagging = c.replace(k=c.k.at[:, rows, n - 2].set(0), v=c.v.at[:, rows, n - 2].set(0),
                        lengths=n - 2)  # fmt: skip

    @jax.jit
    def drafted(cache, feed_prev):
        return draft_block(model.module, model.params, cache, prev, last, n, feed_prev, live,
                           sp, keys, spec=d.spec)  # fmt: skip

    @jax.jit
    def fed_alone(cache):
        args = prev[:, None], (n - 2)[:, None], live[:, None], cache
        return model.module.apply({"params": model.params}, *args)[1]

    both = drafted(lagging, jnp.array([True, True]))
    ref = drafted(fed_alone(lagging), jnp.array([False, False]))
    for x, y in zip(jax.tree.leaves(both), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(x, y)
    unfed = drafted(lagging, jnp.array([False, False]))  # the mutant
    assert not np.array_equal(unfed[0], both[0]) or not np.array_equal(
        jax.tree.leaves(unfed[1])[0], jax.tree.leaves(both[1])[0]
    )


def test_draws_are_keyed_by_position(drafters):
    d = drafters["full"]
    sp, keys = sampling(3), session_keys(7, 3)
    st0 = fresh(d, [*PROMPTS, [9, 9]])
    st1, a = d.draft(st0, sp, keys)
    # Rolled back to the block's start, the same positions re-draft identically.
    st2, b = d.draft(d.rollback(st1, [0, 1, 2], a.start), sp, keys)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert_same_q(a.q, b.q)
    assert_same_state(st1, st2)
    # A row drafts the same alone as in a batch (same key); a dead row is left alone.
    _, c = d.draft(fresh(d, PROMPTS[1:]), sampling(1), keys[1:2])
    np.testing.assert_array_equal(c.tokens[0], a.tokens[1])
    live = jnp.array([True, False, True])
    st3, e = d.draft(st0, sp, keys, live=live)
    np.testing.assert_array_equal(e.tokens[1], [-1] * GAMMA)
    assert int(st3.length[1]) == len(PROMPTS[1])
    np.testing.assert_array_equal(e.tokens[0], a.tokens[0])
    # Another session key draws other tokens.
    _, f = d.draft(st0, sp, session_keys(8, 3))
    assert not np.array_equal(f.tokens, a.tokens)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_q_is_the_distribution_each_draft_was_sampled_from(model, drafters, encoding):
    d = drafters[encoding]
    temperature = 0.0 if encoding == "onehot" else 0.8
    sp, keys = sampling(2, temperature), session_keys(3, 2)
    _, blk = d.draft(fresh(d, PROMPTS), sp, keys)
    assert isinstance(blk, DraftBatch) and blk.tokens.shape == (2, GAMMA)
    for r, prompt in enumerate(PROMPTS):
        seq = np.asarray(prompt + np.asarray(blk.tokens[r]).tolist())[None]
        logits, _ = model(seq, np.arange(seq.shape[1])[None], model.init_cache(1, 16))
        n = len(prompt)
        q_ref = warp(logits[0, n - 1 : n - 1 + GAMMA], sampling(GAMMA, temperature))  # [G, V]
        pos = np.arange(n, n + GAMMA)
        u = uniforms(keys[r : r + 1], pos[None], Purpose.DRAFT)[0]
        drafts = np.asarray(blk.tokens[r])
        if encoding == "full":
            np.testing.assert_allclose(blk.q.probs[r], q_ref, atol=1e-5, rtol=0)
            np.testing.assert_array_equal(drafts, sample(q_ref, u))
        elif encoding == "sparse":
            probs, ids = jax.lax.top_k(q_ref, SPARSE_K)
            np.testing.assert_array_equal(blk.q.ids[r], ids)
            np.testing.assert_allclose(
                blk.q.probs[r], probs / probs.sum(-1, keepdims=True), atol=1e-5
            )
            assert all(drafts[j] in np.asarray(ids[j]) for j in range(GAMMA))
        else:
            assert blk.q.encoding == "onehot"
            greedy = jaxspec.generate(model, prompt, GAMMA, temperature=0, stop_tokens=[])
            assert drafts.tolist() == greedy.tokens == np.argmax(q_ref, -1).tolist()


def test_edge_imports_jaxspec_but_never_verify():
    src = pathlib.Path(__file__).resolve().parent.parent / "edge" / "drafter.py"
    mods = set()
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module.split(".")[0])
    assert "jaxspec" in mods and "verify" not in mods, mods
    assert "aqt" not in mods  # AQT lives in jaxspec.quant.aqt_compat only


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="encoding"):
        Drafter(model, DraftSpec(encoding="dense"))
    with pytest.raises(ValueError, match="gamma"):
        Drafter(model, DraftSpec(gamma=0))
    # The spec is well formed but wider than this model's vocabulary.
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match="sparse_k"):
        Drafter(model, DraftSpec(encoding="sparse", sparse_k=vocab + 1))
    assert Drafter(model, DraftSpec(encoding="sparse", sparse_k=vocab)).spec.k == vocab


def test_quality_tool_tiny_writes_the_tables(tmp_path):
    tool = load_tool("quality_w4a16")
    assert tool.main(["--tiny", "--out", str(tmp_path / "q")]) == 0
    report = json.loads((tmp_path / "q.json").read_text())
    rows = {(r["family"], r["scheme"]): r for r in report["rows"]}
    assert set(rows) == {("draft", "none"), ("draft", "w4a16"), ("self", "none"), ("self", "w4a16")}
    for (family, scheme), r in rows.items():
        assert r["ppl"] > 1 and r["ppl_source"] > 1 and r["ppl_docs"] > 1
        assert 0 <= r["greedy_agreement"] <= 1 and 0 < r["expected_alpha_t1"] <= 1 + 1e-5
        if scheme == "w4a16":  # int4 tiles are 64 columns: the tiny models' 32-wide layers pad
            assert r["bytes_vs_bf16"] < 0.5
        if (family, scheme) != ("self", "none"):
            assert 0 <= r["alpha_t0"] <= 1 and 0 <= r["alpha_t1"] <= 1
    assert report["drafter_speed"]["draft"]["ratio_w4a16_over_bf16"] > 0
    md = (tmp_path / "q.md").read_text()
    assert "| draft | quantization |" in md and "w4a16 / bf16" in md
