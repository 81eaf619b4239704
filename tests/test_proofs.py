"""The exact proofs (`proofs/`): losslessness by enumeration, mutants, closed forms, rules.

Hypothesis draws the distribution tables (small-denominator Fractions with zeros, ties,
p == q and one-hot q) and the sampling params; every example is enumerated exactly.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from fractions import Fraction as F
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs import latency, mean_length, round_law
from proofs.cases import PENALTY_PARAMS, Case, prefixes, random_logit_case
from proofs.check import (
    MUTANT_MODES,
    PROFILES,
    WARP_EXAMPLES,
    apply_example,
    find_counterexample,
    mutant_suite,
    nonstrict_check,
    stale_counts_check,
)
from proofs.enumerate import (
    ENCODINGS,
    Params,
    Spec,
    law_difference,
    speculative_law,
    target_law,
)
from proofs.rule import accept_prob, decide, greedy_decide, residual, sample
from proofs.variants import CONTROLS, CORRECT, MUTANTS, variant_decide
from proofs.warp import (
    apply_top_k,
    apply_top_p,
    argmax,
    onehot,
    penalize,
    softmax2,
    sparse_topk,
    warp,
)

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=60, deadline=None)

# -- strategies ----------------------------------------------------------------------


@st.composite
def dists(draw, vocab: int, zeros: bool = True) -> list[F]:
    """A distribution with weights in 0..3 (1..3 without zeros): zeros and ties are common."""
    w = draw(st.lists(st.integers(0 if zeros else 1, 3), min_size=vocab, max_size=vocab))
    if not any(w):
        w[draw(st.integers(0, vocab - 1))] = 1
    return [F(x, sum(w)) for x in w]


params_st = st.builds(
    Params,
    temperature=st.sampled_from([F(0), F(1, 2), F(1)]),
    top_k=st.sampled_from([0, 1, 2]),
    top_p=st.sampled_from([F(1), F(1, 2), F(3, 4)]),
)


@st.composite
def tables(draw, vocab: int, n: int) -> tuple[dict, dict, str]:
    """(p table, q table, how q relates to p) over every prefix shorter than n."""
    pre = prefixes(vocab, n)
    p = {x: draw(dists(vocab, zeros=draw(st.booleans()))) for x in pre}
    kind = draw(st.sampled_from(["independent", "equal", "onehot", "full_support"]))
    if kind == "equal":
        q = dict(p)
    elif kind == "onehot":
        q = {x: onehot(draw(st.integers(0, vocab - 1)), vocab) for x in pre}
    else:
        q = {x: draw(dists(vocab, zeros=kind == "independent")) for x in pre}
    return p, q, kind


@st.composite
def cases(draw, mode: str, max_n: int = 3) -> Case:
    vocab = draw(st.integers(2, 3))
    n = draw(st.integers(1, max_n))
    p, q, _ = draw(tables(vocab, n))
    spec = Spec(
        mode=mode,
        gamma=draw(st.integers(1, 4)),
        encoding=draw(st.sampled_from(ENCODINGS)),
        depth=draw(st.integers(1, 3)) if mode == "pipelined" else 1,
        sparse_k=draw(st.integers(1, vocab - 1)),
    )
    return Case(vocab, n, p, q, draw(params_st), spec)


def _coin(rng: random.Random) -> list[F]:
    return [F(1, 3), F(2, 3)] if rng.random() < 0.5 else [F(3, 4), F(1, 4)]


def assert_lossless(case: Case, mutant: str | None = None) -> Counter:
    stats: Counter = Counter()
    law = case.law(mutant, stats=stats)
    assert sum(law.values()) == 1
    assert law == case.target(), case.describe()
    return stats


# -- losslessness --------------------------------------------------------------------


@FAST
@given(cases("sync"))
def test_sync_is_lossless(case: Case) -> None:
    assert_lossless(case)


@FAST
@given(cases("pipelined"))
def test_pipelined_is_lossless(case: Case) -> None:
    assert_lossless(case)


@pytest.mark.parametrize(("gamma", "depth"), list(itertools.product([1, 2, 3, 4], [1, 2, 3])))
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_pipelined_deep_is_lossless(gamma: int, depth: int, data: st.DataObject) -> None:
    """N large enough that `depth` blocks are in flight at once and stale blocks occur."""
    n = min(6, gamma * depth + 2)
    p, q, _ = data.draw(tables(2, n))
    encoding = data.draw(st.sampled_from(ENCODINGS))
    spec = Spec(mode="pipelined", gamma=gamma, encoding=encoding, depth=depth, sparse_k=1)
    assert_lossless(Case(2, n, p, q, data.draw(params_st), spec))


def test_pipelined_state_machine_really_pipelines() -> None:
    """Full-support tables: depth blocks fill up, rejections happen, stale blocks are dropped."""
    rng = random.Random(3)
    p = {
        x: [F(1, 3), F(2, 3)] if rng.random() < 0.5 else [F(3, 4), F(1, 4)] for x in prefixes(2, 6)
    }
    q = {x: [F(1, 2), F(1, 2)] for x in p}
    spec = Spec(mode="pipelined", gamma=2, depth=3)
    stats = assert_lossless(Case(2, 6, p, q, Params(), spec))
    assert stats["drafted with 2 block(s) in flight"] > 0
    assert stats["stale blocks dropped"] > 0
    assert stats["rejections"] > 0


def test_zero_target_probability_draft_is_always_rejected() -> None:
    p = {x: [F(0), F(1)] for x in prefixes(2, 3)}
    q = {x: [F(1, 2), F(1, 2)] for x in p}
    for mode in ("sync", "pipelined"):
        stats = assert_lossless(Case(2, 3, p, q, Params(), Spec(mode=mode, gamma=2, depth=2)))
        assert stats["drafts with p(d)=0 (always rejected)"] > 0
    assert target_law(p.__getitem__, 2, 3, Params()) == {(1, 1, 1): 1}


def test_invalid_q_raises() -> None:
    p = {x: [F(1, 2), F(1, 2)] for x in prefixes(2, 2)}
    bad = {x: [F(1, 2), F(1, 4)] for x in p}  # not a distribution
    with pytest.raises(ValueError):
        speculative_law(p.__getitem__, bad.__getitem__, 2, 2, Params(), Spec())
    with pytest.raises(ValueError):
        accept_prob([F(1, 2), F(1, 2)], [F(1), F(0)], 1)  # q(d) = 0: not a reject
    with pytest.raises(ValueError):
        decide([F(1, 2), F(1, 2)], [F(3, 2), F(-1, 2)], 0, F(0), F(0))
    with pytest.raises(ValueError):
        decide([F(1, 2), F(1, 2)], [F(1), F(0), F(0)], 0, F(0), F(0))
    with pytest.raises(ValueError):
        sample([F(1, 2), F(1, 2)], F(1))


# -- mutants -------------------------------------------------------------------------

DETERMINISTIC = {"nonstrict_accept", "draft_counts_stale"}
CAUGHT_BY_ENUMERATION = [
    (name, mode) for name in MUTANTS for mode in MUTANT_MODES[name] if name not in DETERMINISTIC
]


def test_every_mutant_has_a_mode_or_a_deterministic_check() -> None:
    assert set(MUTANT_MODES) == set(MUTANTS)
    assert {name for name, _ in CAUGHT_BY_ENUMERATION} == set(MUTANTS) - DETERMINISTIC


# -- penalties (logit-level models, exact) ----------------------------------------------


@st.composite
def logit_cases(draw, mode: str) -> Case:
    """A logit-level case with penalties (`proofs.cases.random_logit_case`), seeded by
    Hypothesis: every PENALTY_PARAMS entry, every encoding, gamma 1-3, depth 1-2."""
    spec = Spec(
        mode=mode,
        gamma=draw(st.integers(1, 3)),
        encoding=draw(st.sampled_from(ENCODINGS)),
        depth=draw(st.integers(1, 2)),
    )
    rng = random.Random(draw(st.integers(0, 2**32)))
    vocab, n = draw(st.sampled_from([(2, 2), (2, 3), (3, 2)]))
    return random_logit_case(rng, spec, vocab, n, params=draw(st.sampled_from(PENALTY_PARAMS)))


@FAST
@given(logit_cases("sync"))
def test_penalties_sync_are_lossless(case: Case) -> None:
    assert_lossless(case)


@FAST
@given(logit_cases("pipelined"))
def test_penalties_pipelined_are_lossless(case: Case) -> None:
    assert_lossless(case)


def test_penalized_logits_by_hand() -> None:
    """vLLM's order and semantics on exact logits (units of ln 2)."""
    # repetition 2 over prompt {0} and output {1}: 4 -> 2 (prompt), -2 -> -4 (output);
    # token 2 unseen; then frequency 1 * count and presence 1 on the output token 1.
    got = penalize(
        [F(4), F(-2), F(2)], prompt=[0], output=[1, 1], repetition=2, presence=1, frequency=1
    )
    assert got == [F(2), F(-4 - 2 - 1), F(2)]
    assert softmax2([F(1), F(0)]) == [F(2, 3), F(1, 3)]
    with pytest.raises(ValueError, match="integer logits"):
        softmax2([F(1, 2), F(0)])


def test_draft_counts_stale_is_lossless_but_caught() -> None:
    caught, how = stale_counts_check()
    assert caught, how
    case = random_logit_case(random.Random(1), Spec(gamma=2), 2, 3, q_kind="equal")
    assert case.law("draft_counts_stale") == case.target()


def test_counts_not_rolled_back_needs_penalties() -> None:
    """Without penalties the mutant changes nothing (so the catch is the counts')."""
    case = random_logit_case(random.Random(2), Spec(gamma=2), 2, 3, params=Params())
    assert case.law("counts_not_rolled_back") == case.target()


@pytest.mark.parametrize(("name", "mode"), CAUGHT_BY_ENUMERATION)
def test_mutant_is_caught_by_enumeration(name: str, mode: str) -> None:
    found = find_counterexample(random.Random(f"{name}/{mode}"), name, mode, 500)
    assert found is not None, f"mutant {name} survived in {mode} mode"
    case, tv, seq, _ = found
    assert tv > 0
    assert case.law(name).get(seq, F(0)) != case.target().get(seq, F(0))
    assert_lossless(case)  # the same case is lossless under the correct rule


def test_nonstrict_accept_is_caught_deterministically() -> None:
    caught, how = nonstrict_check()
    assert caught, how
    p, q = [F(0), F(1)], [F(1, 2), F(1, 2)]
    assert decide(p, q, 0, F(0), F(0)) == (False, 1)
    assert variant_decide(MUTANTS["nonstrict_accept"], p, q, 0, F(0), F(0)) == (True, 0)


@settings(max_examples=20, deadline=None)
@given(cases("sync", max_n=2))
def test_nonstrict_accept_is_invisible_to_enumeration(case: Case) -> None:
    """u*q == p has probability 0: that is why nonstrict_accept needs its own check."""
    assert case.law("nonstrict_accept") == case.target()


def test_a_correct_mutant_is_reported_as_not_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant suite can fail: a 'mutant' that is the correct rule is not caught."""
    monkeypatch.setitem(MUTANTS, "noop", replace(CORRECT, name="noop"))
    monkeypatch.setitem(MUTANT_MODES, "noop", ("sync", "pipelined"))
    profile = replace(PROFILES["fast"], mutant_attempts=40)
    res = mutant_suite(random.Random(0), profile)
    assert not res.ok
    assert any("noop (sync) NOT caught" in f for f in res.failures)
    assert any("noop (pipelined) NOT caught" in f for f in res.failures)


@settings(max_examples=30, deadline=None)
@given(cases("pipelined"))
def test_stale_block_with_honest_q_is_lossless(case: Case) -> None:
    """Control: the rule is exact for any proposal, so only the q pairing makes stale harmful."""
    assert case.law("stale_block_honest_q") == case.target()


def test_controls_verify_stale_blocks() -> None:
    rng = random.Random(1)
    p = {
        x: [F(1, 3), F(2, 3)] if rng.random() < 0.5 else [F(3, 4), F(1, 4)] for x in prefixes(2, 4)
    }
    q = {x: [F(1, 2), F(1, 2)] for x in p}
    for name in CONTROLS:
        stats = assert_lossless(Case(2, 4, p, q, Params(), Spec("pipelined", 1, depth=2)), name)
        assert stats["stale blocks verified (not dropped)"] > 0


def test_stale_block_accepted_hand_made() -> None:
    """gamma=1, depth=2: block 2 was drafted after the rejected d0, then paired with q(.|c0).

    d0 = 0 is rejected half the time and corrected to 1; the stale draft at position 1 is
    always 0 (q(.|0) = [1, 0]), and paired with q(.|1) = p(.|1) it is always accepted:
    P(1, 0) = 1/2 instead of 1/4.
    """
    p = {(): [F(1, 2), F(1, 2)], (0,): [F(1), F(0)], (1,): [F(1, 2), F(1, 2)]}
    q = {(): [F(1), F(0)], (0,): [F(1), F(0)], (1,): [F(1, 2), F(1, 2)]}
    spec = Spec(mode="pipelined", gamma=1, depth=2)
    case = Case(2, 2, p, q, Params(), spec)
    assert_lossless(case)
    assert case.target() == {(0, 0): F(1, 2), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    assert case.law("stale_block_accepted") == {(0, 0): F(1, 2), (1, 0): F(1, 2)}


def test_unnormalized_residual_hand_made() -> None:
    """p = [1/2, 1/2], q = [1, 0]: the excess 1/2 on token 1 leaves mass 1/2 for token 0."""
    p, q = {(): [F(1, 2), F(1, 2)]}, {(): [F(1), F(0)]}
    case = Case(2, 1, p, q, Params(), Spec(gamma=1))
    assert case.target() == {(0,): F(1, 2), (1,): F(1, 2)}
    assert case.law("unnormalized_residual") == {(0,): F(3, 4), (1,): F(1, 4)}


def test_reused_uniform_hand_made() -> None:
    """Accept rates 1/2 then 1/4 with ONE uniform: both accepted w.p. min = 1/4, not 1/8."""
    p = {(): [F(1, 2), F(1, 2)], (0,): [F(1, 4), F(3, 4)], (1,): [F(1, 2), F(1, 2)]}
    q = {x: [F(1), F(0)] for x in p}
    case = Case(2, 2, p, q, Params(), Spec(gamma=2))
    assert case.target()[(0, 0)] == F(1, 8)
    assert case.law("reused_uniform")[(0, 0)] == F(1, 4)


# -- closed forms --------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 4).flatmap(lambda v: st.tuples(dists(v), dists(v), st.booleans())),
    st.integers(1, 4),
    params_st,
)
def test_expected_tokens_per_round_closed_form(pq, gamma: int, params: Params) -> None:
    p, q, same = pq
    q = list(p) if same else q
    pw, qw = params.apply(p), params.apply(q)
    for encoding, qe in (("full", qw), ("onehot", onehot(argmax(qw), len(p)))):
        alpha = sum(min(a, b) for a, b in zip(pw, qe, strict=True))
        if encoding == "onehot":
            assert alpha == pw[argmax(qw)]  # p(d) for a one-hot draft
        spec = Spec(gamma=gamma, encoding=encoding)
        got = mean_length(round_law(lambda _, p=p: p, lambda _, q=q: q, len(p), params, spec))
        assert got == latency.expected_tokens(alpha, gamma)
        assert got == sum(alpha**i for i in range(gamma + 1))


def test_expected_tokens_alpha_one_is_gamma_plus_one() -> None:
    p = [F(1, 2), F(1, 3), F(1, 6)]
    for gamma in range(1, 5):
        got = mean_length(round_law(lambda _: p, lambda _: p, 3, Params(), Spec(gamma=gamma)))
        assert got == gamma + 1 == latency.expected_tokens(F(1), gamma)


# -- warping tie rules ---------------------------------------------------------------


@pytest.mark.parametrize(("name", "p", "arg", "want"), WARP_EXAMPLES)
def test_warp_examples(name: str, p: list[F], arg: object, want: list[F]) -> None:
    assert apply_example(name, p, arg) == want


def test_warp_tie_rules_by_hand() -> None:
    assert argmax([F(1, 3), F(1, 3), F(1, 3)]) == 0
    assert warp([F(1, 6), F(5, 12), F(5, 12)], temperature=0) == [0, 1, 0]
    assert apply_top_k([F(1, 2), F(1, 4), F(1, 4)], 2) == [F(1, 2), F(1, 4), F(1, 4)]
    assert apply_top_k([F(1, 2), F(1, 4), F(1, 4)], 1) == [1, 0, 0]
    # top-p: 1/2 is strictly more likely than each 1/4 token; 1/2 < 0.6 keeps them both.
    assert apply_top_p([F(1, 2), F(1, 4), F(1, 4)], F(3, 5)) == [F(1, 2), F(1, 4), F(1, 4)]
    assert apply_top_p([F(1, 2), F(1, 4), F(1, 4)], F(1, 2)) == [1, 0, 0]
    assert sparse_topk([F(1, 3), F(1, 3), F(1, 3)], 2) == [F(1, 2), F(1, 2), 0]
    assert warp([F(1, 3), F(2, 3)], temperature=F(1, 3)) == [F(1, 9), F(8, 9)]
    with pytest.raises(ValueError):
        warp([F(1, 2), F(1, 2)], temperature=F(2, 3))  # not 0 or 1/n: not exact
    with pytest.raises(ValueError):
        warp([F(1, 2), F(1, 2)], top_p=0)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 5).flatmap(dists), params_st)
def test_warp_properties(p: list[F], params: Params) -> None:
    w = params.apply(p)
    assert sum(w) == 1 and all(x >= 0 for x in w)
    assert all(x == 0 for x, y in zip(w, p, strict=True) if y == 0)  # support only shrinks
    assert w[argmax(p)] > 0  # the argmax always survives
    assert warp(p) == p and apply_top_k(p, 0) == p and apply_top_p(p, 1) == p
    order = sorted(range(len(p)), key=lambda i: -p[i])
    wo = [w[i] for i in order]
    assert wo == sorted(wo, reverse=True)  # warping keeps the order of probabilities


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 5).flatmap(dists), st.integers(1, 5))
def test_sparse_topk_keeps_exactly_k(q: list[F], k: int) -> None:
    s = sparse_topk(q, k)
    nonzero = sum(1 for x in q if x)
    assert sum(1 for x in s if x) == min(k, nonzero)
    kept = sorted(range(len(q)), key=lambda i: (-q[i], i))[: min(k, nonzero)]
    assert all((s[i] > 0) == (i in kept) for i in range(len(q)))
    assert sum(s) == 1


# -- the rule, step by step ----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 4).flatmap(lambda v: st.tuples(dists(v), dists(v))),
    st.data(),
)
def test_decide_matches_exact_probabilities(pq, data: st.DataObject) -> None:
    """Accept region is [0, min(1, p/q)); residual sample i has region of width res[i]."""
    p, q = pq
    d = data.draw(st.sampled_from([i for i, x in enumerate(q) if x]))
    a = accept_prob(p, q, d)
    assert a == min(1, p[d] / q[d])
    if a > 0:
        assert decide(p, q, d, a - a / 1000, F(0)) == (True, d)
        assert decide(p, q, d, F(0), F(1, 2)) == (True, d)
    if a < 1:
        accepted, token = decide(p, q, d, a, F(0))
        assert not accepted
        res = residual(p, q)
        assert res[token] > 0
    res = residual(p, q)
    cum = F(0)
    for i, x in enumerate(res):
        if x:  # the region of i is [cum, cum + x)
            assert sample(res, cum) == i
            assert sample(res, cum + x - x / 1000) == i
        cum += x
    # A float64 uniform converts exactly.
    u = data.draw(st.floats(0, 1, exclude_max=True))
    assert decide(p, q, d, F(u), F(u))[0] == (F(u) * q[d] < p[d])


def test_residual_zero_mass_falls_back_to_p() -> None:
    p = [F(1, 4), F(3, 4)]
    assert residual(p, p) == p
    assert residual([F(1), F(0)], [F(1, 2), F(1, 2)]) == [1, 0]


def test_zero_probability_token_is_never_accepted_or_sampled() -> None:
    p, q = [F(0), F(1, 2), F(1, 2)], [F(1, 3), F(1, 3), F(1, 3)]
    assert decide(p, q, 0, F(0), F(0)) == (False, 1)  # u = 0 still rejects p(d) = 0
    assert sample([F(0), F(1)], F(0)) == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 4).flatmap(lambda v: st.tuples(dists(v), dists(v))), st.data())
def test_temperature_zero_falls_out_of_the_rule(pq, data: st.DataObject) -> None:
    p, q = pq
    p0 = warp(p, temperature=0)
    q0 = warp(q, temperature=data.draw(st.sampled_from([0, F(1, 2), 1])))
    best = argmax(p)
    for d in (i for i, x in enumerate(q0) if x):
        u_a = F(data.draw(st.integers(0, 999)), 1000)
        u_r = F(data.draw(st.integers(0, 999)), 1000)
        assert decide(p0, q0, d, u_a, u_r) == greedy_decide(p0, d) == (d == best, best)
        assert accept_prob(p0, q0, d) == (d == best)
        if d != best:
            assert residual(p0, q0) == onehot(best, len(p))


def test_correct_variant_decides_like_the_rule() -> None:
    rng = random.Random(0)
    for _ in range(200):
        p = [F(rng.randint(0, 3)) for _ in range(3)]
        q = [F(rng.randint(1, 3)) for _ in range(3)]
        p, q = [x / sum(p) for x in p] if any(p) else [F(1), F(0), F(0)], [x / sum(q) for x in q]
        d, u, r = rng.randrange(3), F(rng.randrange(100), 100), F(rng.randrange(100), 100)
        assert variant_decide(CORRECT, p, q, d, u, r) == decide(p, q, d, u, r)


# -- latency model -------------------------------------------------------------------


def test_latency_model() -> None:
    assert latency.t_sync(4, F(1), F(20), F(5)) == 29
    assert latency.expected_tokens(F(0), 3) == 1
    assert latency.expected_tokens(F(1, 2), 2) == F(7, 4)
    assert latency.expected_tokens(1, 4) == 5
    assert latency.sync_token_time(2, F(1, 2), 1, 3, 2) == F(7) / F(7, 4)
    # depth 1: max of edge drafting and the verify + network round trip
    assert latency.pipelined_block_time(4, 1, 20, 5) == 25
    assert latency.pipelined_block_time(4, 10, 20, 5) == 40
    assert latency.pipelined_block_time(4, 1, 20, 5, depth=5) == 5
    assert latency.pipelined_token_time(4, 10, 20, 5) == 10
    assert latency.capacity_gain(4, F(1), F(2)) == 3
    assert isinstance(latency.pipelined_block_time(3, F(1), F(7), F(2), depth=2), F)
    with pytest.raises(ValueError):
        latency.expected_tokens(F(3, 2), 2)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 6),
    st.fractions(0, 10, max_denominator=10),
    st.fractions(0, 50, max_denominator=10),
    st.fractions(F(1, 10), 10, max_denominator=10),
    st.integers(1, 4),
    st.fractions(0, 1, max_denominator=20),
)
def test_latency_properties(gamma, t_d, t_n, t_v, depth, alpha) -> None:
    block = latency.pipelined_block_time(gamma, t_d, t_n, t_v, depth)
    assert block <= latency.t_sync(gamma, t_d, t_n, t_v)  # pipelining never loses
    assert block >= max(gamma * t_d, t_v)
    e = latency.expected_tokens(alpha, gamma)
    assert e == sum(alpha**i for i in range(gamma + 1))
    assert 1 <= e <= gamma + 1
    assert latency.capacity_gain(gamma, t_d, t_v) == (gamma * t_d + t_v) / t_v


# -- the command line ----------------------------------------------------------------


def test_proofs_is_an_installed_package() -> None:
    """`python -m proofs` runs from anywhere once the project is installed: the package
    list in pyproject.toml includes it (it still imports nothing of the others:
    tests/test_layering.py)."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_packages(str(ROOT), include=find["packages"]["find"]["include"])
    assert "proofs" in found


def test_cli_fast_profile_passes(tmp_path: Path) -> None:
    """From a directory outside the repository (the installed package, not the checkout)."""
    out = subprocess.run(
        [sys.executable, "-m", "proofs", "--profile", "fast", "--seed", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every mutant caught" in out.stdout
    lines = [line.strip() for line in out.stdout.splitlines()]
    for name in MUTANTS:
        assert any(x.startswith(f"- {name} ") and "caught by" in x for x in lines), name


def test_cli_exits_nonzero_when_a_mutant_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    from proofs.__main__ import main

    monkeypatch.setitem(MUTANTS, "noop", replace(CORRECT, name="noop"))
    monkeypatch.setitem(MUTANT_MODES, "noop", ("sync",))
    assert main(["--profile", "fast"]) == 1


def test_laws_are_compared_exactly() -> None:
    """law_difference sees a difference of 1/1000: equality is exact, not approximate."""
    a = {(0,): F(1, 2), (1,): F(1, 2)}
    b = {(0,): F(501, 1000), (1,): F(499, 1000)}
    assert law_difference(a, b) == (F(1, 1000), (0,))
    assert law_difference(a, dict(a)) == (0, None)


def test_pipelined_expected_token_time() -> None:
    g, td, tn, tv = 3, F(2), F(30), F(5)
    # alpha = 1: the steady-state bound; alpha = 0: every block is a sequential restart.
    assert latency.pipelined_expected_token_time(g, F(1), td, tn, tv, 2) == (
        latency.pipelined_token_time(g, td, tn, tv, 2)
    )
    assert latency.pipelined_expected_token_time(g, F(0), td, tn, tv, 2) == latency.t_sync(
        g, td, tn, tv
    )
    # Tokens per block by enumerating the first rejection k (k + 1 tokens) or none (gamma).
    a = F(2, 3)
    tokens = sum((k + 1) * a**k * (1 - a) for k in range(g)) + g * a**g
    block = latency.pipelined_block_time(g, td, tn, tv, 2)
    want = (a**g * block + (1 - a**g) * latency.t_sync(g, td, tn, tv)) / tokens
    assert latency.pipelined_expected_token_time(g, a, td, tn, tv, 2) == want
    assert latency.colocated_token_time(g, a, td, tv) == (g * td + tv) / latency.expected_tokens(
        a, g
    )
