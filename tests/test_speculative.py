"""Co-located speculative decoding: lossless against plain decoding and exact laws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxspec
from jaxspec.ckpts.tiny import tiny_config, to_dtype
from jaxspec.decoding.generate import GammaChoice
from jaxspec.decoding.sampling import SamplingParams, warp
from tests.fixtures import continuation_logits
from tests.mutants import mutated

N_NEW, PROMPT, ROWS = 3, [1, 2], 8192


def _spread(model, scale):
    """Scale random weights up so distributions are far from uniform (tests gain power)."""
    return model.with_params(jax.tree.map(lambda a: a * scale, model.params))


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_config(vocab_size=8)
    target = _spread(jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 1)), 3.0)
    draft = _spread(jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 2)), 3.0)
    return target, draft


def exact_law(target, sampling_kw) -> dict[tuple[int, ...], float]:
    """P(x1 x2 x3 | prompt) of plain decoding, from the target's (warped) logits."""
    V = target.config.vocab_size
    conts, logits = continuation_logits(target, PROMPT, N_NEW)
    with jax.enable_x64(True):
        flat = jnp.asarray(logits.reshape(-1, V))
        params = SamplingParams.make(flat.shape[0], **sampling_kw)
        probs = np.asarray(warp(flat, params)).reshape(len(conts), N_NEW, V)
    law = {}
    for i, c in enumerate(conts):
        head = float(np.prod([probs[i, j, c[j]] for j in range(N_NEW - 1)]))
        for last in range(V):
            law[(*c, last)] = head * float(probs[i, N_NEW - 1, last])
    return law


def gof_pvalue(samples: np.ndarray, law) -> float:
    """Chi-square of sampled sequences against the exact law (bins under 5 expected pooled)."""
    keys = sorted(law)
    n = len(samples)
    counts = dict.fromkeys(keys, 0)
    for row in samples:
        t = tuple(int(x) for x in row)
        if t not in counts or law[t] == 0:
            return 0.0  # a sequence plain decoding can never produce
        counts[t] += 1
    keys = [k for k in keys if law[k] > 0]
    exp = np.array([law[k] * n for k in keys])
    obs = np.array([counts[k] for k in keys], float)
    small = exp < 5
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def _sample(pair, **kw):
    target, draft = pair
    out = jaxspec.generate(
        target, [PROMPT] * ROWS, N_NEW, draft=draft, seed=0, max_batch=ROWS, **kw
    )
    return out.padded, out.stats


WARPED = {"temperature": 0.7, "top_k": 5, "top_p": 0.9}
# min-p and a logit bias (one token pushed up, one down), applied to p and q alike.
OPTIONS = {"min_p": 0.08, "logit_bias": {3: 1.5, 0: -1.0}}
LOSSLESS = [
    ({"mode": "sync", "encoding": "full", "gamma": 2}, {}),
    ({"mode": "pipelined", "encoding": "sparse", "sparse_k": 3, "gamma": 2}, {}),
    ({"mode": "sync", "encoding": "onehot", "gamma": 3}, {}),
    ({"mode": "sync", "encoding": "full", "gamma": 2}, WARPED),
    ({"mode": "sync", "encoding": "full", "gamma": 2}, OPTIONS),
    ({"mode": "pipelined", "encoding": "full", "gamma": 2}, OPTIONS),
]


@pytest.mark.parametrize(("spec", "sampling"), LOSSLESS)
def test_sampled_output_fits_the_exact_target_law(pair, spec, sampling):
    samples, st = _sample(pair, **spec, **sampling)
    assert gof_pvalue(samples, exact_law(pair[0], sampling)) > 1e-3
    assert 0 < st.figures.acceptance_rate < 1  # the draft really differs from the target


MUTANTS = [
    ("bonus_from_q", {}),
    ("reused_uniform", {}),
    ("residual_from_p", {}),
    ("unnormalized_residual", {}),
    ("warp_p_not_q", WARPED),
    ("options_p_not_q", OPTIONS),
]


@pytest.mark.parametrize(("mutant", "sampling"), MUTANTS)
def test_the_fit_test_rejects_every_mutant(pair, mutant, sampling):
    samples, _ = mutated(*pair, PROMPT, ROWS, N_NEW, mutant, **sampling)
    assert gof_pvalue(samples, exact_law(pair[0], sampling)) < 1e-6


@pytest.fixture(scope="module")
def hf_pair(hf_checkpoints):
    target = jaxspec.load(hf_checkpoints["gqa"][0])
    draft = jaxspec.load(hf_checkpoints["mqa_tied"][0])
    return target, draft


@pytest.mark.parametrize(
    ("mode", "encoding", "gamma"),
    [
        ("sync", "full", 1),
        ("sync", "onehot", 4),
        ("pipelined", "sparse", 3),
        ("pipelined", "full", 5),
    ],
)
def test_greedy_speculative_equals_plain_greedy(hf_pair, mode, encoding, gamma):
    """Token for token, with an unrelated draft (many rejections) and with the target as its
    own draft (every draft accepted, bonus tokens in sync mode)."""
    target, draft = hf_pair
    rng = np.random.RandomState(6)
    prompts = [rng.randint(0, 64, n).tolist() for n in (1, 5, 11)]
    plain = jaxspec.generate(target, prompts, 20, temperature=0.0)
    for d in (draft, target):
        spec = jaxspec.generate(
            target, prompts, 20, temperature=0.0, draft=d, gamma=gamma, mode=mode,
            encoding=encoding,
        )  # fmt: skip
        assert spec.tokens == plain.tokens
    assert spec.stats.figures.acceptance_rate == 1.0
    per_round = gamma + 1 if mode == "sync" else gamma  # the last round is cut at 20
    assert spec.stats.figures.rounds == 3 * -(-20 // per_round)


def test_speculative_rows_are_independent_of_batch_mates(hf_pair):
    target, draft = hf_pair
    with jax.enable_x64(True):
        t64, d64 = to_dtype(target, jnp.float64), to_dtype(draft, jnp.float64)
        prompts = [[3, 4], [5, 6, 7, 8, 9], [10]]
        kw = dict(temperature=1.0, top_k=20, draft=d64, gamma=3, mode="pipelined")
        batch = jaxspec.generate(t64, prompts, 12, seeds=[1, 2, 3], **kw)
        for p, s, row in zip(prompts, [1, 2, 3], batch.tokens, strict=True):
            assert jaxspec.generate(t64, p, 12, seeds=[s], **kw).tokens == row


def test_stats_and_stop_tokens(hf_pair):
    target, draft = hf_pair
    free = jaxspec.generate(target, [[1, 2, 3]], 16, temperature=0.0, draft=draft, gamma=3)
    s = free.stats.figures
    assert s.num_draft_tokens == 3 * s.rounds and s.num_drafts == s.rounds and s.emitted == 16
    assert s.acceptance_rate == pytest.approx(s.num_accepted_tokens / s.num_draft_tokens)
    assert s.tokens_per_round == pytest.approx(16 / s.rounds, abs=(3 + 1) / s.rounds)
    assert s.mean_acceptance_length == pytest.approx(1 + s.num_accepted_tokens / s.rounds)
    assert list(s.per_position_acceptance) == sorted(s.per_position_acceptance, reverse=True)
    stop = free.tokens[0][7]
    out = jaxspec.generate(
        target, [[1, 2, 3]], 16, temperature=0.0, draft=draft, gamma=3, stop_tokens=[stop]
    )
    assert out.tokens[0] == free.tokens[0][: free.tokens[0].index(stop) + 1]


def test_gamma_auto_picks_by_measuring_and_decodes_as_that_gamma(hf_pair):
    """gamma="auto" (here an adaptive spec, longest block 3): the forwards are measured, the
    acceptance probed (probes of max_new_tokens here: fewer than 16) on a pair that has none
    yet, the gamma in 0..3 with the least modelled time per token is picked and recorded,
    and the output is exactly generate's at that gamma. A second call reads the acceptance
    the pair has shown since instead of probing."""
    target, draft = hf_pair
    draft = draft.with_params(jax.tree.map(jnp.copy, draft.params))  # a pair seen nowhere else
    prompts, kw = [[1, 2, 3], [4, 5]], dict(temperature=0.8, draft=draft, seeds=[4, 5])
    longest = jaxspec.DraftSpec(gamma=3, adaptive=True)
    auto = jaxspec.generate(target, prompts, 12, draft_spec=longest, **kw)
    s, a = auto.stats, auto.stats.auto
    assert 0 <= s.gamma <= 3 and (a.gamma, a.longest, a.probe_tokens) == (s.gamma, 3, 12)
    assert a.draft_s > 0 and a.draft2_s > 0 and a.target_s > 0 and len(a.verify_s) == 3
    assert len(a.alphas) == 3 and "ms/token" in a.describe()
    assert s.gamma == min(range(4), key=lambda g: (a.token_s(g, "sync", 12), g))
    fixed = jaxspec.generate(target, prompts, 12, gamma=max(s.gamma, 1), **kw)
    if s.gamma:
        assert (
            fixed.tokens == auto.tokens and s.figures.num_draft_tokens == s.gamma * s.figures.rounds
        )
    again = jaxspec.generate(target, prompts, 12, draft_spec=longest, **kw).stats.auto
    assert again.probe_tokens == 0 and "earlier calls" in again.describe()
    plain = jaxspec.generate(target, prompts, 12, gamma="auto", temperature=0.8, seeds=[4, 5])
    assert (plain.stats.gamma, plain.stats.auto, plain.stats.figures) == (None, None, None)


def test_gamma_auto_model_prices_a_round_as_measured():
    """The model behind gamma="auto": a block's time is its draft forwards (the first two
    wide after a fully accepted sync block) and its verify forward, over E[A] tokens; a pair
    whose drafts are never accepted decodes plain (0), one whose drafts always are takes the
    block the verify costs call for, and a verify that grows steeply with the block keeps it
    short."""

    def choice(alpha, verify):
        return GammaChoice(gamma=0, longest=4, draft_s=0.004, target_s=0.02, alphas=(alpha,) * 4,
                           acceptance_rate=alpha, probe_tokens=0, draft2_s=0.005,
                           verify_s=verify)  # fmt: skip

    flat = (0.02, 0.02, 0.02, 0.02)
    c = choice(1.0, flat)
    assert c.token_s(4) == pytest.approx((3 * 0.004 + 0.005 + 0.02) / 5)
    assert c.token_s(4, "pipelined") == pytest.approx((4 * 0.004 + 0.02) / 5)
    best = lambda c: min(range(5), key=lambda g: (c.token_s(g), g))  # noqa: E731
    assert best(choice(0.0, flat)) == 0 and best(c) == 4
    assert best(choice(1.0, (0.02, 0.025, 0.06, 0.09))) == 2
    # 6 tokens: gamma 4 needs two rounds (5 + 1), gamma 2 two (3 + 3): the block that fits
    assert c.token_s(4, "sync", 6) == pytest.approx(2 * (3 * 0.004 + 0.005 + 0.02) / 6)
    assert min(range(5), key=lambda g: (c.token_s(g, "sync", 6), g)) == 2


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"gamma": -1}, "gamma"),  # 0 is speculation off: plain decoding (test_gamma0)
        ({"gamma": 65}, "gamma"),
        ({"gamma": "often"}, "gamma"),
        ({"mode": "async"}, "mode"),
        ({"encoding": "dense"}, "encoding"),
        ({"encoding": "sparse", "sparse_k": 0}, "sparse_k"),
        ({"encoding": "sparse", "sparse_k": 10**6}, "sparse_k"),  # wider than the vocabulary
    ],
)
def test_bad_speculative_options(hf_pair, kw, message):
    target, draft = hf_pair
    with pytest.raises(ValueError, match=message):
        jaxspec.generate(target, [1, 2], 4, draft=draft, **kw)


def test_draft_with_another_vocabulary_is_rejected(hf_pair, pair):
    with pytest.raises(ValueError, match="vocabulary"):
        jaxspec.generate(hf_pair[0], [1, 2], 4, draft=pair[1])
