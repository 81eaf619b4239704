"""The papers' latency/capacity model, as the benchmarks evaluate it (docs/design.md
names the two papers).

`proofs/latency.py` derives these formulas and proves their properties; `proofs` is not
installed and imports nothing of the package (an independent second implementation), so the
suite carries its own copy and `tests/test_bench.py` holds it equal to the proofs', exactly,
on Fractions. Every function is plain arithmetic: Fraction inputs give Fraction results.

Symbols: gamma drafts per round, alpha per-position acceptance, t_d draft time per token,
t_v one verification step, rtt the network round trip of one block, depth blocks in flight.
"""

from __future__ import annotations

from fractions import Fraction

Number = Fraction | int | float


def expected_tokens(alpha: Number, gamma: int) -> Number:
    """E[A] = 1 + alpha + ... + alpha^gamma: tokens per sync round, bonus included."""
    return sum((alpha**i for i in range(gamma + 1)), Fraction(0) * alpha)


def sync_token_time(gamma: int, alpha: Number, t_d: Number, rtt: Number, t_v: Number) -> Number:
    """Sync edge-cloud: a round drafts, waits a round trip and a verification, commits E[A]."""
    return (gamma * t_d + rtt + t_v) / expected_tokens(alpha, gamma)


def colocated_token_time(gamma: int, alpha: Number, t_d: Number, t_v: Number) -> Number:
    """Co-located speculative decoding: the sync round without the network."""
    return sync_token_time(gamma, alpha, t_d, 0 * t_d, t_v)


def pipelined_token_time(
    gamma: int, alpha: Number, t_d: Number, rtt: Number, t_v: Number, depth: int
) -> Number:
    """Pipelined edge-cloud, expected time per token (renewal-reward over blocks).

    A fully accepted block (probability alpha^gamma) costs the steady-state spacing of the
    pipeline, max(gamma*t_d, t_v, (rtt + t_v)/depth); a block with a rejection flushes the
    pipeline and costs a whole sync round. A block commits sum_{i<gamma} alpha^i tokens (no
    bonus while drafts keep coming).
    """
    full = alpha**gamma
    spacing = max(gamma * t_d, t_v, (rtt + t_v) / Fraction(depth))
    restart = gamma * t_d + rtt + t_v
    tokens = expected_tokens(alpha, gamma - 1)
    return (full * spacing + (1 - full) * restart) / tokens


def capacity_factor(gamma: int, t_d: Number, t_v: Number) -> Number:
    """Paper B: with drafts offloaded, a saturated server spends t_v per client round instead
    of gamma*t_d + t_v, so it sustains (1 + gamma*t_d/t_v)x the clients at the same rate."""
    return 1 + gamma * t_d / t_v
