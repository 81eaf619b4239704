"""Adaptive gamma: the model it optimizes (per-position acceptance, one implementation with
the benchmarks) and the controller's choices from measurements. The session-level test
(pipelined output identical to fixed gamma) is at the end of this file."""

from __future__ import annotations

import asyncio
from fractions import Fraction as F

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from edge.adaptive import AdaptiveGamma
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.ckpts.tiny import tiny_config, to_dtype
from jaxspec.decoding import analytic
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
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
                g = analytic.best_gamma(mode, *args, depth=2, longest=8)
                costs = {
                    k: analytic.sync_token_time(k, *args)
                    if mode == "sync"
                    else analytic.pipelined_token_time(k, *args, 2)
                    for k in range(1, 9)
                }
                assert costs[g] == min(costs.values())
    # A long round trip and high acceptance want long blocks; poor acceptance short ones.
    assert analytic.best_gamma("sync", F(19, 20), F(1, 200), F(1, 5), 0, longest=8) == 8
    assert analytic.best_gamma("sync", F(1, 10), F(1, 200), 0, F(1, 100), longest=8) == 1


def _feed(ctl: AdaptiveGamma, alpha_pattern: list[bool], t_draft: float, latency: float):
    for g in range(1, ctl.longest + 1):
        ctl.observe_draft(g, 99.0)  # each length's first call compiles: ignored
    for _ in range(40):
        ctl.observe_draft(4, 4 * t_draft)
        accepted = next((i for i, ok in enumerate(alpha_pattern) if not ok), len(alpha_pattern))
        ctl.observe_result(len(alpha_pattern), accepted, latency)


def test_controller_follows_what_it_measures():
    ctl = AdaptiveGamma(8, "pipelined", depth=2)
    assert ctl.next_gamma() == 8  # nothing measured yet: the longest block measures all
    _feed(ctl, [True] * 8, t_draft=0.002, latency=0.2)  # every draft accepted, slow link
    assert ctl.t_draft == pytest.approx(0.002) and ctl.latency == pytest.approx(0.2)
    assert ctl.next_gamma() == 8
    low = AdaptiveGamma(8, "pipelined", depth=1)
    _feed(low, [False], t_draft=0.01, latency=0.0)  # the first draft always rejected
    assert low.alphas()[0] < 0.1
    assert low.next_gamma() == 1  # pipelined never stops drafting (module doc)
    assert ctl.chosen == [8, 8] and low.chosen == [1]


def test_sync_controller_stops_drafting_where_it_loses_and_probes():
    """Drafts always rejected and dear, answers quick: no drafting (0) is faster, so the
    sync controller picks 0, with one probe block of the best length every `probe_every`."""
    ctl = AdaptiveGamma(8, "sync", probe_every=3)
    _feed(ctl, [False], t_draft=0.01, latency=0.002)
    assert ctl.plain_token_time() < ctl.token_time(1)
    picks = [ctl.next_gamma() for _ in range(9)]
    assert picks == [0, 0, 0, 1, 0, 0, 0, 1, 0]
    # Where drafting pays (every draft accepted, a slow link), it never stops.
    good = AdaptiveGamma(8, "sync")
    _feed(good, [True] * 8, t_draft=0.001, latency=0.2)
    assert all(good.next_gamma() == 8 for _ in range(20))
    # The same losing measurements in pipelined mode: never 0.
    pipe = AdaptiveGamma(8, "pipelined", depth=2)
    _feed(pipe, [False], t_draft=0.01, latency=0.002)
    assert all(pipe.next_gamma() >= 1 for _ in range(20))
    with pytest.raises(ValueError, match="probe_every"):
        AdaptiveGamma(4, "sync", probe_every=0)


def test_start_is_the_longest_block_the_acceptance_supports():
    ctl = AdaptiveGamma(6, "sync", prior_weight=0.0)
    assert ctl.supported_gamma() == 6 and ctl.next_gamma() == 6  # nothing measured
    ctl.observe_result(6, 6, None)  # all six accepted: reach prob 1 everywhere
    assert ctl.next_gamma() == 6
    ctl.observe_result(6, 2, None)
    ctl.observe_result(6, 2, None)  # a0 = a1 = 1, a2 = 1/3: draft 3 reached w.p. 1/3
    assert ctl.alphas()[:3] == pytest.approx([1.0, 1.0, 1 / 3])
    assert ctl.supported_gamma() == 3
    for _ in range(4):
        ctl.observe_result(6, 0, None)  # a0 = 3/7 now: draft 1 reached w.p. < 1/2
    assert ctl.supported_gamma() == 1
    assert AdaptiveGamma(6, "sync", start_gamma=2).next_gamma() == 2


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
    cfg = SessionConfig(prompt=(1, 2, 3, 4), max_new_tokens=new,
                        sampling=SamplingSettings(temperature=1.0), seed=5,
                        mode="pipelined", draft=spec)  # fmt: skip
    # Started short (the default start, the longest block, is the best here): it must adapt.
    policy = AdaptiveGamma(gamma, "pipelined", 2, prior_weight=1.0, start_gamma=2) if auto else None

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


class _Script:
    """A block_len that plays a script of lengths (then repeats its last), for sessions."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __call__(self) -> int:
        return self.lengths.pop(0) if len(self.lengths) > 1 else self.lengths[0]


def _sync_session(pair, block_len, new: int = 12, on_rollback=None, drafter=Drafter):
    draft, sched = pair
    spec = DraftSpec(gamma=6, encoding="full", adaptive=True)
    cfg = SessionConfig(prompt=(1, 2, 3, 4), max_new_tokens=new,
                        sampling=SamplingSettings(temperature=1.0), seed=5,
                        mode="sync", draft=spec)  # fmt: skip

    async def go():
        v = LocalVerifier(scheduler=sched)
        try:
            return await run_session(
                v, drafter(draft, spec), cfg, block_len=block_len, on_rollback=on_rollback
            )
        finally:
            await v.aclose()

    with jax.enable_x64(True):
        return asyncio.run(go())


def test_a_sync_session_that_stops_drafting_is_plain_decoding(pair):
    """Blocks of 0 drafts: the verifier samples each token with plain decoding's draw, so a
    session that never drafts has plain decoding's tokens exactly."""
    trace = _sync_session(pair, _Script([0]))
    with jax.enable_x64(True):
        plain = jaxspec.generate(pair[1].model, [1, 2, 3, 4], 12, seeds=[5]).tokens
    assert trace.tokens == plain and trace.figures.num_draft_tokens == 0


def test_a_probe_after_empty_blocks_drafts_from_a_rebuilt_cache(pair):
    """Empty blocks, then a probe: after every round the drafter's KV of the context the
    drafts followed equals a drafter built from scratch on that context (the KV of the
    tokens it did not draft is rebuilt), and the session runs to its end."""
    draft = pair[0]
    spec = DraftSpec(gamma=6, adaptive=True)
    fresh_drafter = Drafter(draft, spec)
    checked = []

    class Checked(Drafter):
        def round(self, *args, **kw):  # the session's round (it donates its input state)
            state, batch = super().round(*args, **kw)
            n = int(batch.start[0])  # the context the drafts followed
            ctx = [int(t) for t in state.tokens[0, :n]]
            fresh = fresh_drafter.prefill(fresh_drafter.init(1, state.tokens.shape[1]), [ctx])
            np.testing.assert_allclose(
                state.cache.k[:, 0, : n - 1], fresh.cache.k[:, 0, : n - 1], atol=1e-9
            )
            checked.append(n)
            return state, batch

    trace = _sync_session(pair, _Script([0, 0, 0, 3, 0, 0, 2, 0, 4]), new=16, drafter=Checked)
    assert len(trace.tokens) == 16 and 0 < trace.figures.num_draft_tokens and len(checked) >= 2
