"""Gemma 3 on small random configs: the sliding window through everything that rolls back or
resumes (speculation, the verifier's resume, batch invariance), and lossless sampling on a
Gemma pair. The architecture's parity with transformers is tests/test_model.py's ("gemma3"
variant); the real 270M checkpoint is tests/test_gemma3_real.py's."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxspec
from edge.drafter import Drafter
from jaxspec.ckpts.tiny import tiny_gemma3_config
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from tests.fixtures import blocks_resumed_at_every_point
from tests.mutants import mutated
from tests.test_batch_invariance import differences, needs_kernel
from tests.test_speculative import exact_law, gof_pvalue
from verify import LocalVerifier, Scheduler, SchedulerConfig

WINDOW = 5


def _model(seed: int, scale: float = 3.0, **overrides) -> jaxspec.Model:
    """A random Gemma 3 (a window of 5 unless overridden), weights scaled up so that
    distributions are peaked and two seeds' differ (drafts both accepted and rejected)."""
    cfg = tiny_gemma3_config(**overrides)
    m = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, seed))
    return m.with_params(jax.tree.map(lambda a: a * scale, m.params))


@pytest.fixture(scope="module")
def pair() -> tuple[jaxspec.Model, jaxspec.Model]:
    return _model(1), _model(2)


def test_the_window_is_in_force(pair):
    """Past the window the local layers' output differs from one whose window never binds (a
    model that ignored the window would pass every test below that compares it with
    itself)."""
    target, _ = pair
    full = target.with_params(target.params, config=tiny_gemma3_config(sliding_window=10_000))
    ids = np.arange(1, 13)[None] % target.config.vocab_size
    pos = np.arange(12)[None]
    a, _ = target(ids, pos, target.init_cache(1, 16))
    b, _ = full(ids, pos, full.init_cache(1, 16))
    np.testing.assert_array_equal(np.asarray(a)[0, :WINDOW], np.asarray(b)[0, :WINDOW])
    assert not np.allclose(np.asarray(a)[0, WINDOW:], np.asarray(b)[0, WINDOW:])


@pytest.mark.parametrize(("mode", "gamma"), [("sync", 3), ("pipelined", 4)])
def test_greedy_speculation_rolls_back_across_the_window_edge_losslessly(pair, mode, gamma):
    """An unrelated draft (rejections, so rollbacks land before and after the window's edge,
    prompts shorter and longer than the window): token for token plain greedy decoding."""
    target, draft = pair
    rng = np.random.RandomState(3)
    prompts = [rng.randint(0, 64, n).tolist() for n in (2, 4, 9)]
    plain = jaxspec.generate(target, prompts, 24, temperature=0.0)
    spec = jaxspec.generate(
        target, prompts, 24, temperature=0.0, draft=draft, gamma=gamma, mode=mode
    )
    assert spec.tokens == plain.tokens
    assert 0 < spec.stats.figures.acceptance_rate < 1


@needs_kernel
def test_a_position_is_the_same_bits_in_every_shape_past_the_window(pair):
    """Batch invariance (prefill vs block vs decode, batch mates, KV buckets) at 30 positions,
    six times the window."""
    found = differences(pair[0])
    assert not any(found.values()), found


@needs_kernel
def test_a_resume_past_the_window_equals_the_uninterrupted_run(pair):
    """At T = 0.9, a session (a 9-token prompt, 24 new tokens, a window of 5) whose verifier
    goes away at its i-th block and that resumes with its committed tokens, every position
    of them past the window's first edge, ends with exactly the uninterrupted tokens."""
    target, draft = pair
    config = SchedulerConfig(max_sessions=2, max_len=64, max_gamma=4, row_buckets=(1, 2))
    verifier = LocalVerifier(scheduler=Scheduler(target, config))
    spec = DraftSpec(gamma=3, encoding="full")
    session = SessionConfig(
        prompt=tuple(range(3, 12)), max_new_tokens=24, sampling=SamplingSettings(temperature=0.9),
        seed=11, draft=spec,
    )  # fmt: skip

    drafter = lambda: Drafter(draft, spec)  # noqa: E731
    assert blocks_resumed_at_every_point(verifier, drafter, session) >= 4


N_NEW, PROMPT, ROWS = 3, [1, 2], 8192


@pytest.fixture(scope="module")
def small_vocab_pair() -> tuple[jaxspec.Model, jaxspec.Model]:
    """Vocabulary 8 (the exact law is enumerable) and a window of 2, so the 3 new tokens'
    positions 2..4 lie past the window."""
    return _model(1, vocab_size=8, sliding_window=2), _model(2, vocab_size=8, sliding_window=2)


def test_sampled_gemma_speculation_fits_the_exact_target_law(small_vocab_pair):
    target, draft = small_vocab_pair
    out = jaxspec.generate(
        target, [PROMPT] * ROWS, N_NEW, draft=draft, seed=0, max_batch=ROWS, gamma=2,
        mode="pipelined",
    )  # fmt: skip
    assert gof_pvalue(out.padded, exact_law(target, {})) > 1e-3
    assert 0 < out.stats.figures.acceptance_rate < 1


def test_the_fit_test_rejects_a_mutant_on_the_gemma_pair(small_vocab_pair):
    samples, _ = mutated(*small_vocab_pair, PROMPT, ROWS, N_NEW, "residual_from_p")
    assert gof_pvalue(samples, exact_law(small_vocab_pair[0], {})) < 1e-6
