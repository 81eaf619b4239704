"""`verify_block` held to the exact implementation in `proofs/` (float64, same uniforms)."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec.compilation.traces import traces
from jaxspec.decoding.sampling import Purpose, SamplingParams, session_keys, uniforms, warp
from jaxspec.decoding.verification import DraftQ, _accepts, check_draft_q, verify_block
from proofs import rule
from proofs import warp as exact_warp
from tests.mutants import injected, replacement

V, K, B = 6, 4, 3
DEN = 64  # dyadic probabilities: exact in float64, so both sides see the same p and q
RULE_MUTANTS = ["reused_uniform", "residual_from_p", "unnormalized_residual", "bonus_from_q"]


@st.composite
def dist(draw, zeros=True):
    w = draw(st.lists(st.integers(0 if zeros else 1, 8), min_size=V, max_size=V))
    if sum(w) == 0:
        w[draw(st.integers(0, V - 1))] = 1
    # Round to multiples of 1/DEN that sum to exactly 1.
    total = sum(w)
    units = [x * DEN // total for x in w]
    units[int(np.argmax(w))] += DEN - sum(units)
    return [Fraction(u, DEN) for u in units]


@st.composite
def block_case(draw):
    """One padded batch: per row p's (K+1), q's (K), drafts sampled from q, n, mode."""
    rows = []
    for _ in range(B):
        enc = draw(st.sampled_from(["full", "onehot"]))
        ps = [draw(dist()) for _ in range(K + 1)]
        temp0 = draw(st.booleans())
        qs, ds = [], []
        for _ in range(K):
            q = draw(dist())
            d = draw(st.sampled_from([i for i in range(V) if q[i] > 0]))
            qs.append(exact_warp.onehot(d, V) if enc == "onehot" else q)
            ds.append(d)
        rows.append(
            dict(
                p=ps, q=qs, d=ds, n=draw(st.integers(0, K)), sync=draw(st.booleans()),
                temp0=temp0, start=draw(st.integers(1, 50)), seed=draw(st.integers(0, 10**6)),
            )
        )  # fmt: skip
    return rows


def _run(rows):
    with jax.enable_x64(True):
        with np.errstate(divide="ignore"):  # log(0) = -inf: a zero-probability token
            logits = np.log(np.array([[[float(x) for x in p] for p in r["p"]] for r in rows]))
        q = np.array([[[float(x) for x in qq] for qq in r["q"]] for r in rows])
        d = np.array([r["d"] for r in rows], np.int32)
        n = np.array([r["n"] for r in rows], np.int32)
        sampling = SamplingParams.make(B, temperature=[0.0 if r["temp0"] else 1.0 for r in rows])
        keys = session_keys([r["seed"] for r in rows], B)
        start = np.array([r["start"] for r in rows], np.int32)
        sync = np.array([r["sync"] for r in rows])
        res = verify_block(
            jnp.asarray(d), jnp.asarray(n), jnp.asarray(logits, jnp.float64),
            DraftQ.full(jnp.asarray(q, jnp.float64)), sampling, keys, jnp.asarray(start),
            jnp.asarray(sync),
        )  # fmt: skip
        pos = start[:, None] + np.arange(K + 1)[None, :]
        u = {
            p: np.asarray(uniforms(keys, jnp.asarray(pos), p), np.float64)
            for p in (Purpose.ACCEPT, Purpose.RESIDUAL, Purpose.BONUS)
        }
    return res, u


def _exact_row(r, u_acc, u_res, u_bonus):
    """The block by the exact rule: tokens and number accepted."""
    ps = [exact_warp.warp(p, temperature=0) if r["temp0"] else p for p in r["p"]]
    out = []
    for j in range(r["n"]):
        ok, tok = rule.decide(ps[j], r["q"][j], r["d"][j], Fraction(u_acc[j]), Fraction(u_res[j]))
        out.append(tok)
        if not ok:
            return out, j
    if r["sync"]:
        out.append(rule.sample(ps[r["n"]], Fraction(u_bonus[r["n"]])))
    return out, r["n"]


def _mismatches(rows) -> int:
    res, u = _run(rows)
    bad = 0
    for b, r in enumerate(rows):
        tokens, acc = _exact_row(
            r, u[Purpose.ACCEPT][b], u[Purpose.RESIDUAL][b], u[Purpose.BONUS][b]
        )
        got = [t for t in np.asarray(res.tokens[b]).tolist() if t >= 0]
        bad += got != tokens or int(res.num_accepted[b]) != acc
        bad += int(res.num_emitted[b]) != len(tokens)
    return bad


@settings(max_examples=150)
@given(block_case())
def test_decisions_equal_the_exact_rule(rows):
    assert _mismatches(rows) == 0


@pytest.mark.parametrize("mutant", RULE_MUTANTS)
def test_the_property_catches_every_rule_mutant(mutant):
    """The same property, run on seeded examples, must fail for each mutant (`tests/mutants.py`,
    put in the rule's place)."""
    caught = 0
    rng = np.random.RandomState(0)
    with injected(mutant):
        for i in range(40):
            rows = _seeded_case(rng, i)
            caught += _mismatches(rows) > 0
    assert caught > 0, f"{mutant} was not caught"


def _seeded_case(rng, i):
    """Deterministic examples (Hypothesis' .example() is not for tests)."""

    def d():
        w = rng.randint(0, 9, V)
        w[rng.randint(V)] += 1
        units = w * DEN // w.sum()
        units[np.argmax(w)] += DEN - units.sum()
        return [Fraction(int(x), DEN) for x in units]

    rows = []
    for _ in range(B):
        qs = [d() for _ in range(K)]
        ds = [int(rng.choice(np.flatnonzero([x > 0 for x in q]))) for q in qs]
        rows.append(
            dict(p=[d() for _ in range(K + 1)], q=qs, d=ds, n=int(rng.randint(1, K + 1)),
                 sync=bool(i % 2), temp0=False, start=int(rng.randint(1, 50)), seed=i)
        )  # fmt: skip
    return rows


def test_a_zero_probability_token_is_never_accepted_even_at_u_zero():
    assert not bool(_accepts(jnp.float32(0), jnp.float32(0.5), jnp.float32(0)))
    assert bool(_accepts(jnp.float32(0), jnp.float32(0.5), jnp.float32(1e-9)))
    # The mutant that uses <= accepts it: the test above is able to fail.
    nonstrict = replacement("nonstrict_accept")
    assert bool(nonstrict(jnp.float32(0), jnp.float32(0.5), jnp.float32(0)))


def test_warp_matches_the_exact_warp():
    """JAX warping (float64) equals `proofs.warp` on tables with ties and zeros; top_p values
    sit between partial sums so no float rounding can flip a boundary."""
    rng = np.random.RandomState(1)
    cases = 0
    with jax.enable_x64(True):
        for _ in range(60):
            w = rng.randint(0, 6, V)
            w[0] += 1
            p = [Fraction(int(x), int(w.sum())) for x in w]
            t = [0, Fraction(1, 2), 1][rng.randint(3)]
            k = int(rng.randint(0, V + 1))
            top_p = Fraction(int(rng.randint(1, 16)) * 2 + 1, 32)
            want = exact_warp.warp(p, temperature=t, top_k=k, top_p=top_p)
            params = SamplingParams.make(1, temperature=float(t), top_k=k, top_p=float(top_p))
            logits = jnp.log(jnp.asarray([[float(x) for x in p]], jnp.float64))
            got = np.asarray(warp(logits, params)[0])
            np.testing.assert_allclose(got, [float(x) for x in want], atol=1e-12)
            cases += 1
    assert cases == 60


def test_mixed_rows_one_compilation_and_padding():
    """Rows differ in num_draft, mode and temperature; a new mix reuses the compilation."""
    rng = np.random.RandomState(2)
    logits = jnp.asarray(rng.randn(B, K + 1, V), jnp.float32)
    q = jax.nn.softmax(jnp.asarray(rng.randn(B, K, V), jnp.float32))
    d = jnp.asarray(rng.randint(0, V, (B, K)), jnp.int32)
    keys = session_keys(0, B)
    start = jnp.array([3, 10, 7])
    args = (d, jnp.array([0, 2, 4]), logits, DraftQ.full(q))
    res = verify_block(*args, SamplingParams.make(B, temperature=[0.0, 1.0, 0.5]), keys, start)
    other, mode = SamplingParams.make(B, temperature=1.3, top_k=2), jnp.array([True, False, True])
    with traces() as traced:  # nothing but the rule runs inside: no trace at all
        res2 = verify_block(*args, other, keys, start, mode=mode)
    assert traced == []
    two = (d[:2], jnp.array([1, 2]), logits[:2], DraftQ.full(q[:2]), SamplingParams.make(2))
    with traces() as traced:  # the check can fail: a shape not seen before is traced
        verify_block(*two, keys[:2], start[:2], mode=mode[:2])
    assert traced
    for r in (res, res2):
        toks = np.asarray(r.tokens)
        for b in range(B):
            e = int(r.num_emitted[b])
            assert (toks[b, :e] >= 0).all() and (toks[b, e:] == -1).all()
            assert int(r.num_accepted[b]) <= [0, 2, 4][b]
    # Row 0 has no drafts: sync emits exactly one token (the bonus); greedy is its argmax.
    assert int(res.num_emitted[0]) == 1
    assert int(res.tokens[0, 0]) == int(jnp.argmax(logits[0, 0]))
    assert int(res2.num_emitted[1]) == int(res2.num_accepted[1]) + (
        int(res2.num_accepted[1]) < 2
    )  # pipelined: no bonus after a fully accepted block


def test_sparse_and_onehot_encodings_densify():
    d = jnp.array([[2, 0]])
    sp = DraftQ.sparse(jnp.array([[[2, 1], [0, 3]]]), jnp.array([[[0.75, 0.25], [0.5, 0.5]]]))
    np.testing.assert_allclose(sp.dense(d, 4)[0], [[0, 0.25, 0.75, 0], [0.5, 0, 0, 0.5]], atol=1e-7)
    np.testing.assert_array_equal(DraftQ.onehot().dense(d, 4)[0], [[0, 0, 1, 0], [1, 0, 0, 0]])


def test_q_lookups_equal_the_dense_q_bit_for_bit():
    """The rule reads q at the drafts and at one position per row (`at_drafts`, `row`) rather
    than densifying `[B, K, V]`: the same values to the bit, duplicate sparse ids included,
    for every encoding and for the verifier's mixed rows."""
    rng = np.random.default_rng(0)
    Bq, Kq, Vq, k = 4, 3, 11, 5
    d = jnp.asarray(rng.integers(0, Vq, (Bq, Kq)), jnp.int32)
    ids = jnp.asarray(rng.integers(0, 4, (Bq, Kq, k)), jnp.int32).at[:, :, 0].set(d)  # dups
    probs = jnp.asarray(rng.dirichlet(np.ones(k), (Bq, Kq)), jnp.float32)
    full = jnp.asarray(rng.dirichlet(np.ones(Vq), (Bq, Kq)), jnp.float32)
    mixed = DraftQ.mixed(full, jnp.array([True, False, True, False]), ids, probs)
    j = jnp.array([0, 2, 1, 2])
    for q in (DraftQ.full(full), DraftQ.sparse(ids, probs), DraftQ.onehot(), mixed):
        dense = np.asarray(q.dense(d, Vq))
        at = np.take_along_axis(dense, np.asarray(d)[..., None], -1)[..., 0]
        np.testing.assert_array_equal(np.asarray(q.at_drafts(d)), at, err_msg=q.encoding)
        np.testing.assert_array_equal(
            np.asarray(q.row(j, d, Vq)), dense[np.arange(Bq), np.asarray(j)], err_msg=q.encoding
        )
    dense = np.asarray(mixed.dense(d, Vq))
    np.testing.assert_array_equal(dense[0], np.asarray(full[0]))  # a full row reads full q
    assert dense[1].sum(-1) == pytest.approx(np.ones(Kq), abs=1e-6)


@pytest.mark.parametrize(
    ("q", "d", "message"),
    [
        (DraftQ.full(np.array([[[0.5, 0.5, 0.0]]])), [[2]], "q\\(d\\) = 0"),
        (DraftQ.full(np.array([[[0.5, 0.6, 0.0]]])), [[0]], "normalized"),
        (DraftQ.full(np.array([[[np.nan, 0.5, 0.5]]])), [[1]], "NaN"),
        (DraftQ.full(np.array([[[-0.5, 1.0, 0.5]]])), [[1]], "negative"),
        (DraftQ.sparse(np.array([[[0, 7]]]), np.array([[[0.5, 0.5]]])), [[0]], "ids"),
        (DraftQ.onehot(), [[3]], "draft token ids"),
    ],
)
def test_invalid_draft_q_is_rejected_not_verified(q, d, message):
    with pytest.raises(ValueError, match=message):
        check_draft_q(np.array(d), np.array([1]), q, vocab=3)


def test_valid_draft_q_passes():
    check_draft_q(
        np.array([[1, 9]]), np.array([1]), DraftQ.full(np.array([[[0.25, 0.75, 0]] * 2])), 3
    )
