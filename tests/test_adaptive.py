"""Adaptive gamma: the model it optimizes (per-position acceptance, one implementation with
the benchmarks) and the controller's choices from measurements. The session-level test
(pipelined output identical to fixed gamma) is at the end of this file."""

from __future__ import annotations

import asyncio
from fractions import Fraction as F

import jax
import jax.numpy as jnp
import pytest

import jaxspec
from edge.adaptive import AdaptiveGamma
from edge.drafter import Drafter
from edge.session import DelayedEndpoint, run_session
from jaxspec import analytic
from jaxspec.protocol import DraftSpec, SessionConfig
from jaxspec.testing import tiny_config, to_dtype
from proofs import latency as proofs_latency
from verify import LocalVerifier, Scheduler, SchedulerConfig


def test_per_position_alpha_reduces_to_the_papers_model_exactly():
    for a in (F(0), F(1, 3), F(9, 10), F(1)):
        for g in (1, 2, 5):
            assert analytic.expected_tokens([a] * g, g) == analytic.expected_tokens(a, g)
            assert analytic.expected_tokens(a, g) == proofs_latency.expected_tokens(a, g)
            args = (F(1, 100), F(1, 20), F(1, 50))
            assert analytic.pipelined_token_time(g, [a], *args, 2) == (
                proofs_latency.pipelined_expected_token_time(g, a, *args, 2)
            )
    # Unequal positions: E[A] = 1 + a0 + a0 a1 (+ a0 a1 a1 with the last value repeated).
    assert analytic.expected_tokens([F(1, 2), F(1, 4)], 2) == 1 + F(1, 2) + F(1, 8)
    assert analytic.expected_tokens([F(1, 2), F(1, 4)], 3) == 1 + F(1, 2) + F(1, 8) + F(1, 32)


def test_best_gamma_is_the_argmin_of_the_model():
    for mode in ("sync", "pipelined"):
        for alpha in (F(1, 5), F(3, 5), F(19, 20)):
            for rtt in (F(0), F(1, 20), F(1, 5)):
                args = (alpha, F(1, 200), rtt, F(1, 100))
                g = analytic.best_gamma(mode, *args, depth=2, max_gamma=8)
                costs = {
                    k: analytic.sync_token_time(k, *args)
                    if mode == "sync"
                    else analytic.pipelined_token_time(k, *args, 2)
                    for k in range(1, 9)
                }
                assert costs[g] == min(costs.values())
    # A long round trip and high acceptance want long blocks; poor acceptance short ones.
    assert analytic.best_gamma("sync", F(19, 20), F(1, 200), F(1, 5), 0, max_gamma=8) == 8
    assert analytic.best_gamma("sync", F(1, 10), F(1, 200), 0, F(1, 100), max_gamma=8) == 1


def _feed(ctl: AdaptiveGamma, alpha_pattern: list[bool], t_draft: float, latency: float):
    for g in range(1, ctl.max_gamma + 1):
        ctl.observe_draft(g, 99.0)  # each length's first call compiles: ignored
    for _ in range(40):
        ctl.observe_draft(4, 4 * t_draft)
        accepted = next((i for i, ok in enumerate(alpha_pattern) if not ok), len(alpha_pattern))
        ctl.observe_result(len(alpha_pattern), accepted, latency)


def test_controller_follows_what_it_measures():
    ctl = AdaptiveGamma(8, "pipelined", depth=2)
    assert ctl.next_gamma() == 4  # nothing measured yet
    _feed(ctl, [True] * 8, t_draft=0.002, latency=0.2)  # every draft accepted, slow link
    assert ctl.t_draft == pytest.approx(0.002) and ctl.latency == pytest.approx(0.2)
    assert ctl.next_gamma() == 8
    low = AdaptiveGamma(8, "sync")
    _feed(low, [False], t_draft=0.01, latency=0.0)  # the first draft always rejected
    assert low.alphas()[0] < 0.1
    assert low.next_gamma() == 1
    assert ctl.chosen == [4, 8] and low.chosen == [1]


def test_positions_are_counted_only_where_the_rule_looked():
    ctl = AdaptiveGamma(4, "sync", prior_weight=0.0)
    ctl.observe_result(4, 1, None)  # draft 0 accepted, draft 1 rejected, 2 and 3 never tested
    ctl.observe_result(4, 4, None)
    assert ctl.tested == [2, 2, 1, 1] and ctl.accepted == [2, 1, 1, 1]
    assert ctl.alphas() == [1.0, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="mode"):
        AdaptiveGamma(4, "colocated")


# --- a session driven by the controller (float64 tiny models: exact decisions) -------------


@pytest.fixture(scope="module")
def pair():
    """A float64 target, a draft close to it (long accepts, some rejections), a scheduler."""
    with jax.enable_x64(True):
        cfg = tiny_config()
        base = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        target, draft = (
            to_dtype(base.with_params(jax.tree.map(lambda a, s=s: a * s, base.params)), jnp.float64)
            for s in (3.0, 2.9)
        )
        sched = Scheduler(target, SchedulerConfig(max_sessions=2, max_len=128, max_gamma=6))
        yield draft, sched


def _run(pair, gamma: int, auto: bool, one_way_s: float, new: int = 24):
    draft, sched = pair
    spec = DraftSpec(gamma=gamma, encoding="full", adaptive=auto)
    cfg = SessionConfig(prompt=(1, 2, 3, 4), max_new_tokens=new, temperature=1.0, seed=5,
                        mode="pipelined", draft=spec)  # fmt: skip
    policy = AdaptiveGamma(gamma, "pipelined", 2, prior_weight=1.0) if auto else None

    async def go():
        v = LocalVerifier(scheduler=sched)
        try:
            ep = DelayedEndpoint(v, one_way_s=one_way_s)
            return await run_session(ep, Drafter(draft, spec), cfg, depth=2, block_len=policy)
        finally:
            await v.aclose()

    with jax.enable_x64(True):
        return asyncio.run(go()), policy


def test_an_adaptive_session_has_the_tokens_of_every_fixed_gamma(pair):
    auto, policy = _run(pair, 6, True, one_way_s=0.01)
    assert len(policy.chosen) == auto.blocks_sent and policy.t_draft and policy.latency
    assert len(set(policy.chosen)) > 1  # it did adapt: the first blocks use start_gamma
    for g in (1, 3, 6):
        fixed, _ = _run(pair, g, False, one_way_s=0.0)
        assert fixed.tokens == auto.tokens


def test_draft_time_separates_the_fixed_cost_of_a_block():
    """Blocks cost fixed + per_token * g: the fit recovers both, so a controller that has
    drafted short blocks does not think long ones cost g times a short block's."""
    ctl = AdaptiveGamma(8, "pipelined", 2)
    for g in (1, 2, 4):
        ctl.observe_draft(g, 1.0)  # first call of each length: compilation, ignored
        for _ in range(10):
            ctl.observe_draft(g, 0.004 + 0.001 * g)
    assert ctl.draft_time(8) == pytest.approx(0.004 / 8 + 0.001)
    assert ctl.draft_time(1) == pytest.approx(0.005)
    ctl.observe_result(4, 2, 0.05, step_s=0.01)
    assert ctl.t_verify == pytest.approx(0.01) and ctl.latency == pytest.approx(0.05)
