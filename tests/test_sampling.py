"""Warping, inverse-CDF sampling and position-keyed randomness."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from jaxspec.decoding.sampling import (
    Purpose,
    SamplingParams,
    argmax,
    check_seed,
    position_key,
    sample,
    session_key,
    session_keys,
    uniforms,
    warp,
)


def _warp1(logits, **kw):
    return np.asarray(warp(jnp.asarray([logits], jnp.float32), SamplingParams.make(1, **kw))[0])


def test_temperature_zero_is_one_hot_at_lowest_argmax():
    np.testing.assert_array_equal(_warp1([1.0, 3.0, 3.0, 0.0], temperature=0.0), [0, 1, 0, 0])


_ARGMAX = jax.jit(argmax)
_SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.0])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.one_of(_SPECIAL, st.floats(-4, 4, width=32)), min_size=7, max_size=7),
        min_size=3,
        max_size=3,
    )
)
def test_two_pass_argmax_is_jnp_argmax(rows):
    """The index `jnp.argmax` gives in every case: ties (lowest), NaN (the first), infinities,
    signed zeros, all equal. A mutant that takes the highest index on ties is caught."""
    x = jnp.asarray(rows, jnp.float32)
    np.testing.assert_array_equal(np.asarray(_ARGMAX(x)), np.asarray(jnp.argmax(x, axis=-1)))


def test_two_pass_argmax_mutant_is_caught():
    x = jnp.asarray([[1.0, 3.0, 3.0], [np.nan, 0.0, np.nan]], jnp.float32)
    top = jnp.max(x, axis=-1, keepdims=True)
    highest = jnp.max(jnp.where(x == top, jnp.arange(3), -1), axis=-1)  # the mutant
    assert not np.array_equal(np.asarray(highest), np.asarray(jnp.argmax(x, axis=-1)))
    np.testing.assert_array_equal(np.asarray(argmax(x)), [1, 0])


def test_no_warping_is_softmax():
    logits = [0.5, -1.0, 2.0, 0.0]
    np.testing.assert_allclose(_warp1(logits), jax.nn.softmax(jnp.array(logits)), rtol=1e-6)


def test_top_k_keeps_boundary_ties():
    p = _warp1(np.log([0.4, 0.2, 0.2, 0.1, 0.1]), top_k=2)
    np.testing.assert_allclose(p, [0.5, 0.25, 0.25, 0, 0], atol=1e-6)
    p = _warp1(np.log([0.4, 0.3, 0.2, 0.1]), top_k=1)
    np.testing.assert_allclose(p, [1, 0, 0, 0], atol=1e-6)


def test_top_p_keeps_tokens_whose_strictly_higher_mass_is_below_p():
    probs = [0.5, 0.2, 0.2, 0.1]
    # mass strictly above: 0, 0.5, 0.5, 0.9.
    np.testing.assert_allclose(_warp1(np.log(probs), top_p=0.5), [1, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(
        _warp1(np.log(probs), top_p=0.55), [5 / 9, 2 / 9, 2 / 9, 0], atol=1e-6
    )
    np.testing.assert_allclose(_warp1(np.log(probs), top_p=1.0), probs, atol=1e-6)


def test_order_is_temperature_then_top_k_then_top_p():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    p = _warp1(logits, temperature=0.5, top_k=3, top_p=0.9)
    t = np.array([0.5, 0.3, 0.15]) ** 2
    t /= t.sum()  # [0.6757, 0.2432, 0.0608]: mass above the third = 0.919 >= 0.9
    np.testing.assert_allclose(p, [t[0] / t[:2].sum(), t[1] / t[:2].sum(), 0, 0], rtol=1e-5)


def test_sample_never_draws_a_zero_probability_token():
    probs = jnp.array([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    u = jnp.array([0.0, 0.4999, 0.5, np.nextafter(np.float32(1), np.float32(0))])
    assert sample(probs, u).tolist() == [1, 1, 3, 3]


def test_sampled_frequencies_fit_the_warped_distribution():
    """Chi-square of 20k position-keyed draws against warp(); the mutant that samples the
    unwarped softmax must be rejected by the same test."""
    logits = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams.make(1, temperature=0.7, top_k=5, top_p=0.95)
    probs = np.asarray(warp(logits[None], params)[0], np.float64)
    n = 20_000
    keys = session_keys(0, n)
    u = uniforms(keys, jnp.full((n, 1), 7), Purpose.TARGET)[:, 0]
    support = probs > 0

    def p_value(dist):
        draws = np.asarray(sample(jnp.broadcast_to(jnp.asarray(dist, jnp.float32), (n, 6)), u))
        counts = np.bincount(draws, minlength=6)
        if counts[~support].any():  # a draw the target never makes
            return 0.0
        return stats.chisquare(counts[support], n * probs[support]).pvalue

    assert p_value(probs) > 1e-3
    mutant = np.asarray(jax.nn.softmax(logits))  # warping skipped
    assert p_value(mutant) < 1e-6


def test_position_keys_are_pure_functions_of_seed_position_purpose():
    k = session_key(3, 1)
    a = position_key(k, 10, Purpose.ACCEPT)
    np.testing.assert_array_equal(a, position_key(session_key(3, 1), 10, Purpose.ACCEPT))
    others = [
        position_key(k, 11, Purpose.ACCEPT),
        position_key(k, 10, Purpose.RESIDUAL),
        position_key(session_key(3, 2), 10, Purpose.ACCEPT),
    ]
    for o in others:
        assert not np.array_equal(a, o)
    np.testing.assert_array_equal(session_keys(3, 4)[1], k)
    np.testing.assert_array_equal(session_keys([5, 3], 2)[1], session_key(3, 0))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": [1.0, 0.5]}, "temperature has .2,. values for 3 rows"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"logit_bias": {-1: 1.0}}, "token ids must be ints >= 0"),
        ({"logit_bias": {"3": 1.0}}, "token ids must be ints >= 0"),
        ({"logit_bias": {3: float("inf")}}, "finite and within"),
        ({"logit_bias": {3: 101.0}}, "finite and within"),
        ({"logit_bias": {3: "x"}}, "must be a number"),
        ({"logit_bias": dict.fromkeys(range(33), 1.0)}, "at most 32"),
        ({"logit_bias": {70: 1.0}, "vocab_size": 64}, r"outside \[0, 64\)"),
        ({"logit_bias": [{1: 1.0}]}, "1 maps for 3 rows"),
    ],
)
def test_bad_sampling_params_are_rejected(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams.make(3, **kw)


def test_seeds_are_limited_to_the_32_bits_a_key_keeps():
    """Without x64, PRNGKey keeps 32 bits of a seed: 2**32 + 5 would draw exactly as 5. The one
    limit refuses such seeds in the API, the flags and the verifier alike."""
    assert np.array_equal(jax.random.PRNGKey(2**32 + 5), jax.random.PRNGKey(5))
    check_seed(0)
    check_seed(2**32 - 1)
    for bad in (-1, 2**32, 2**63):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
            check_seed(bad)
    with pytest.raises(ValueError, match="seed must be"):
        session_keys(2**32 + 5, 2)
    with pytest.raises(ValueError, match="seed must be"):
        session_keys([1, 2**32], 2)


OPTIONS = [
    dict(min_p=Fraction(1, 2)),
    dict(min_p=Fraction(1, 3), temperature=Fraction(1, 2)),
    dict(logit_bias=((0, Fraction(3)),)),
    dict(logit_bias=((1, Fraction(1, 4)), (4, Fraction(7)))),
    dict(temperature=Fraction(0), logit_bias=((2, Fraction(5)),)),
    dict(min_p=Fraction(1, 4), top_k=3, top_p=Fraction(3, 4), logit_bias=((3, Fraction(2)),)),
]


@pytest.mark.parametrize("opts", OPTIONS)
def test_min_p_and_logit_bias_equal_the_exact_warp(opts):
    """The JAX warp with min-p and a logit bias (bias = ln w) equals `proofs.warp` on exact
    rationals, in float64, over random distributions with ties and zeros."""
    from proofs.warp import apply_logit_bias, apply_temperature
    from proofs.warp import warp as exact_warp

    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(40):
        w = rng.integers(1, 97, size=6).astype(float)
        w[rng.integers(0, 6)] = 0 if rng.random() < 0.5 else w[0]  # zeros and ties, sometimes
        p = [Fraction(int(x), int(w.sum())) for x in w]
        want = exact_warp(p, **{"temperature": 1, **opts})
        # Exact ties that the bias or min-p threshold create (5/18 * ... == 5/18) are decided
        # by rounding in floating point: such cases cannot be compared, the others must agree.
        t = opts.get("temperature", 1)
        shaped = apply_temperature(apply_logit_bias(p, opts.get("logit_bias", ())), t or 1)
        floor = opts.get("min_p", 0) * max(shaped)
        positive = [x for x in shaped if x]
        if len(set(positive)) < len(positive) or (floor and floor in shaped):
            continue
        checked += 1
        bias = {x: float(np.log(float(f))) for x, f in opts.get("logit_bias", ())}
        kw = {k: float(v) for k, v in opts.items() if k in ("temperature", "min_p", "top_p")}
        kw |= {"top_k": opts.get("top_k", 0), "logit_bias": bias}
        with jax.enable_x64(True):
            logits = jnp.log(jnp.asarray([[float(x) for x in p]], jnp.float64))
            params = SamplingParams.make(1, **kw)
            got = np.asarray(warp(logits, params)[0])
        np.testing.assert_allclose(got, [float(x) for x in want], atol=1e-9)
    assert checked >= 10


def test_logit_bias_moves_greedy_and_options_off_is_the_mutants_q():
    logits = [2.0, 1.0, 0.5, 0.0]
    assert np.argmax(_warp1(logits, temperature=0.0, logit_bias={3: 2.5})) == 3
    assert np.argmax(_warp1(logits, temperature=0.0, logit_bias={0: -100.0})) == 1
    params = SamplingParams.make(1, min_p=0.5, logit_bias={3: 3.0})
    x = jnp.asarray([logits], jnp.float32)
    plain = np.asarray(warp(x, SamplingParams.make(1)))
    np.testing.assert_allclose(np.asarray(warp(x, params, options=False)), plain)
    assert not np.allclose(np.asarray(warp(x, params)), plain)


def _whole_sort_cuts(scaled_BV, params):
    """top-k then top-p by sorting every row whole: the definition the tiers must equal."""
    V = scaled_BV.shape[-1]
    desc = -jnp.sort(-scaled_BV, axis=-1)
    kth = jnp.take_along_axis(desc, jnp.clip(params.top_k, 1, V)[:, None] - 1, axis=-1)
    keep_k = (params.top_k[:, None] == 0) | (scaled_BV >= kth)
    probs = jax.nn.softmax(jnp.where(keep_k, scaled_BV, -jnp.inf), axis=-1)
    p_desc = -jnp.sort(-probs, axis=-1)
    mass_above = jnp.cumsum(p_desc, axis=-1) - p_desc
    top_p = params.top_p.astype(probs.dtype)[:, None]
    n_in = jnp.sum(mass_above < top_p, axis=-1, keepdims=True)
    cut = jnp.take_along_axis(p_desc, jnp.maximum(n_in - 1, 0), axis=-1)
    probs = jnp.where((top_p >= 1) | (probs >= cut), probs, 0)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)


def _tier_cases(seed: int):
    """Rows over 8,192 logits whose cuts fall in each tier (peaked: the top 256; flatter:
    the top 4,096; flat, or a top_k past 4,096: the whole row), with ties."""
    rng = np.random.default_rng(seed)
    scale = np.asarray([12.0, 3.0, 0.3, 6.0])[:, None]
    x = (rng.standard_normal((4, 8192)) * scale).astype(np.float32)
    x[3] = np.round(x[3])  # ties at the cut
    p = SamplingParams.make(
        4, temperature=1.0, top_k=[0, 300, 0, int(rng.choice([0, 5000, 40]))],
        top_p=[0.9, 0.95, float(rng.choice([0.5, 0.99])), 0.8],
    )  # fmt: skip
    return jnp.asarray(x), p


def test_tiered_cuts_equal_the_whole_sort(monkeypatch):
    """top-k / top-p from the largest 256, then 4,096 values give bit for bit what sorting
    whole rows gives; the mutant that trusts the first tier without checking its mass
    (FAST_MARGIN -1) is caught."""
    import jaxspec.decoding.sampling as sampling

    for seed in range(3):
        x, p = _tier_cases(seed)
        want = _whole_sort_cuts(x, p)
        assert bool(jnp.all(sampling._top_k_top_p(x, p) == want)), seed
        for i in range(4):  # alone, each row stops at its own tier
            row = jax.tree.map(lambda a, i=i: a[i : i + 1], p)
            got = sampling._top_k_top_p(x[i : i + 1], row)
            assert bool(jnp.all(got == want[i : i + 1])), (seed, i)
    monkeypatch.setattr(sampling, "FAST_MARGIN", -1.0)
    x, p = _tier_cases(0)
    assert not bool(jnp.all(sampling._top_k_top_p(x, p) == _whole_sort_cuts(x, p)))
