"""Adaptive gamma: the model it optimizes (per-position acceptance, one implementation with
the benchmarks) and the controller's choices from measurements. The session-level test
(pipelined output identical to fixed gamma) is at the end of this file."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from edge.adaptive import AdaptiveGamma
from jaxspec import analytic
from proofs import latency as proofs_latency


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
