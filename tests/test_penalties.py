"""Repetition, presence and frequency penalties: the warp against a reference and the exact
proofs, their validation, and speculative decoding with them sampled against the exact law
(plain, sync and pipelined), with the two counting mutants caught."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import jaxspec
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.decoding.sampling import SamplingParams, TokenCounts, warp
from proofs.enumerate import Params
from tests.fixtures import continuation_logits
from tests.mutants import mutated

B, V = 4, 8


def reference(logits, prompt_mask, out_counts, r, e, f):
    """vLLM's `apply_penalties` in float64 NumPy, written out once more."""
    x = np.array(logits, np.float64)
    seen = prompt_mask | (out_counts > 0)
    rr = np.where(seen, r[:, None], 1.0)
    x = np.where(x > 0, x / rr, x * rr)
    return x - f[:, None] * out_counts - e[:, None] * (out_counts > 0)


def _softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


penalties = st.tuples(
    st.lists(st.sampled_from([1.0, 0.5, 1.3, 2.0]), min_size=B, max_size=B),
    st.lists(st.sampled_from([0.0, -1.0, 0.7, 2.0]), min_size=B, max_size=B),
    st.lists(st.sampled_from([0.0, 0.5, -0.4, 1.5]), min_size=B, max_size=B),
)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-4, 4, width=32), min_size=B * V, max_size=B * V),
    st.lists(st.integers(0, 3), min_size=B * V, max_size=B * V),
    st.lists(st.booleans(), min_size=B * V, max_size=B * V),
    penalties,
)
def test_warp_applies_vllm_penalties(logits, counts, prompt, pen):
    logits = np.asarray(logits, np.float32).reshape(B, V)
    counts = np.asarray(counts, np.int32).reshape(B, V)
    prompt = np.asarray(prompt).reshape(B, V)
    r, e, f = (np.asarray(x, np.float32) for x in pen)
    params = SamplingParams.make(B, repetition_penalty=r, presence_penalty=e, frequency_penalty=f)
    tc = TokenCounts(prompt=jnp.asarray(prompt), output=jnp.asarray(counts))
    got = np.asarray(warp(jnp.asarray(logits), params, tc))
    want = _softmax(reference(logits, prompt, counts, r, e, f))
    np.testing.assert_allclose(got, want, atol=2e-6)
    # Greedy reads the penalized logits too.
    greedy = SamplingParams.make(
        B, temperature=0.0, repetition_penalty=r, presence_penalty=e, frequency_penalty=f
    )
    one = np.asarray(warp(jnp.asarray(logits), greedy, tc))
    pen_logits = reference(logits, prompt, counts, r, e, f).astype(np.float32)
    # the token greedy takes holds the largest penalized logit (a tie within float32 rounding
    # of the two computations may go either way)
    chosen = pen_logits[np.arange(B), one.argmax(-1)]
    np.testing.assert_allclose(chosen, pen_logits.max(-1), rtol=0, atol=1e-5)


def test_default_penalties_change_nothing_bit_for_bit():
    logits = jax.random.normal(jax.random.PRNGKey(0), (B, V)) * 3
    tc = TokenCounts(prompt=jnp.ones((B, V), bool), output=jnp.full((B, V), 2, jnp.int32))
    for kw in ({}, {"temperature": 0.0}, {"top_k": 3, "top_p": 0.8, "min_p": 0.1}):
        params = SamplingParams.make(B, **kw)
        np.testing.assert_array_equal(warp(logits, params, tc), warp(logits, params))


def test_order_is_bias_then_penalties_then_temperature():
    """A bias that makes a logit positive is then divided by the repetition penalty."""
    logits = jnp.asarray([[-1.0, 0.0]])
    tc = TokenCounts(prompt=jnp.asarray([[True, False]]), output=jnp.zeros((1, 2), jnp.int32))
    params = SamplingParams.make(1, temperature=0.5, logit_bias={0: 3.0}, repetition_penalty=2.0)
    got = np.asarray(warp(logits, params, tc))[0]
    want = _softmax(np.array([(-1.0 + 3.0) / 2.0, 0.0]) / 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_jax_warp_equals_the_exact_logit_level_warp():
    """The proofs' exact logits are in units of ln 2: JAX's warp of l * ln 2 (penalties of
    presence and frequency times ln 2) equals the exact distribution."""
    F = Fraction
    cases = [
        ([4, -2, 0, 2], (0,), (1, 1), Params(repetition_penalty=F(2), presence_penalty=F(1))),
        ([2, 2, -4, 0], (), (0, 2), Params(repetition_penalty=F(1, 2), frequency_penalty=F(1))),
        ([0, 2, 4, -2], (2,), (3, 3, 1), Params(frequency_penalty=F(-1), presence_penalty=F(2))),
        ([0, 2, 4, -2], (2,), (2,), Params(temperature=F(1, 2), repetition_penalty=F(2))),
    ]
    ln2 = math.log(2)
    for logits, prompt, output, p in cases:
        exact = p.__class__(**{**p.__dict__, "prompt": prompt}).apply_logits(
            [F(x) for x in logits], output
        )
        params = SamplingParams.make(
            1,
            temperature=float(p.temperature),
            repetition_penalty=float(p.repetition_penalty),
            presence_penalty=float(p.presence_penalty) * ln2,
            frequency_penalty=float(p.frequency_penalty) * ln2,
        )
        tc = TokenCounts(
            prompt=jnp.asarray([[x in prompt for x in range(4)]]),
            output=jnp.asarray([[output.count(x) for x in range(4)]], jnp.int32),
        )
        got = np.asarray(warp(jnp.asarray([logits], jnp.float32) * ln2, params, tc))[0]
        np.testing.assert_allclose(got, [float(x) for x in exact], atol=1e-6)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"repetition_penalty": 1e-50}, "repetition_penalty"),  # 0 in float32
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        ({"frequency_penalty": [0.1, 0.2]}, "frequency_penalty has"),
    ],
)
def test_bad_penalties_raise_value_error(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams.make(3, **kw)


# -- speculative decoding with penalties, sampled --------------------------------------

N_NEW, PROMPT, ROWS = 3, [1, 2], 8192
PEN = {"repetition_penalty": 1.8, "presence_penalty": 0.8, "frequency_penalty": 0.6}


def _spread(model, scale):
    return model.with_params(jax.tree.map(lambda a: a * scale, model.params))


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_config(vocab_size=V)
    target = _spread(jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 1)), 3.0)
    draft = _spread(jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 2)), 3.0)
    return target, draft


@pytest.fixture(scope="module")
def exact_law(pair):
    """P(x1 x2 x3 | prompt) of plain decoding with PEN, from float64 logits and the NumPy
    reference penalties (prompt and output counted as vLLM counts them)."""
    conts, logits = continuation_logits(pair[0], PROMPT, N_NEW)  # logits [S, N_NEW, V]
    one = np.ones(1)
    prompt_mask = np.isin(np.arange(V), PROMPT)[None, :]
    law = {}
    for i, c in enumerate(conts):
        prob = 1.0
        for j in range(N_NEW):
            out = np.bincount(c[:j], minlength=V)[None, :]
            pen = reference(
                logits[i, j][None], prompt_mask, out, PEN["repetition_penalty"] * one,
                PEN["presence_penalty"] * one, PEN["frequency_penalty"] * one,
            )  # fmt: skip
            p = _softmax(pen)[0]
            if j < N_NEW - 1:
                prob *= p[c[j]]
            else:
                for last in range(V):
                    law[(*c, last)] = prob * p[last]
    return law


def gof_pvalue(samples, law) -> float:
    keys = sorted(law)
    counts = dict.fromkeys(keys, 0)
    for row in samples:
        counts[tuple(int(x) for x in row)] += 1
    exp = np.array([law[k] * len(samples) for k in keys])
    obs = np.array([counts[k] for k in keys], float)
    small = exp < 5
    exp = np.append(exp[~small], exp[small].sum())
    obs = np.append(obs[~small], obs[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def _sample(target, draft=None, **kw):
    out = jaxspec.generate(
        target, [PROMPT] * ROWS, N_NEW, draft=draft, seed=0, max_batch=ROWS, **PEN, **kw
    )
    return out.padded, out.stats


@pytest.mark.parametrize(
    "spec",
    [
        None,
        {"mode": "sync", "gamma": 2},
        {"mode": "pipelined", "gamma": 2},
    ],
)
def test_penalized_output_fits_the_exact_law(pair, exact_law, spec):
    target, draft = pair
    samples, st_ = _sample(target, draft if spec else None, **(spec or {}))
    assert gof_pvalue(samples, exact_law) > 1e-3
    if spec:
        assert 0 < st_.figures.acceptance_rate < 1


def test_counts_not_rolled_back_is_caught(pair, exact_law):
    """The verifier's counts keep a rejected block's drafts: the law moves, and the same
    fit test rejects it."""
    target, draft = pair
    samples, _ = mutated(target, draft, PROMPT, ROWS, N_NEW, "counts_not_rolled_back", **PEN)
    assert gof_pvalue(samples, exact_law) < 1e-6


def test_draft_counts_stale_is_caught_by_acceptance(pair):
    """With the target as its own draft, q == p at every position (the drafts update the
    counts exactly as the verifier does), so every draft is accepted; the mutant whose
    draft does not count its own earlier drafts loses acceptance (its law stays exact:
    the q it sends is the q it sampled from)."""
    target = pair[0]
    _, good = _sample(target, target, mode="sync", gamma=2)
    _, bad = mutated(target, target, PROMPT, ROWS, N_NEW, "draft_counts_stale", **PEN)
    assert good.figures.acceptance_rate > 0.999
    assert bad.figures.acceptance_rate < 0.95


def test_penalties_travel_on_the_wire():
    from jaxspec.protocol import InvalidArgument, SamplingSettings, SessionConfig, wire

    pen = SamplingSettings(repetition_penalty=1.3, presence_penalty=-0.5, frequency_penalty=2.0)
    c = SessionConfig(prompt=(1, 2), sampling=pen)
    back = wire.config_from_proto(wire.config_to_proto(c)).sampling
    assert back.repetition_penalty == pytest.approx(1.3)
    assert (back.presence_penalty, back.frequency_penalty) == (-0.5, 2.0)
    # An old client's request (the fields unset) is today's session: penalties off.
    m = wire.config_to_proto(SessionConfig(prompt=(1, 2)))
    m.ClearField("repetition_penalty")
    m.ClearField("presence_penalty")
    old = wire.config_from_proto(m).sampling
    assert (old.repetition_penalty, old.presence_penalty, old.frequency_penalty) == (1, 0, 0)
    m.repetition_penalty = 0.0  # set: checked as given, refused as it comes off the wire
    with pytest.raises(InvalidArgument, match="repetition_penalty"):
        wire.config_from_proto(m)
