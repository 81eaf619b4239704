"""The papers' latency/capacity model: what the benchmarks evaluate and what the edge's
adaptive gamma (`edge.adaptive`) optimizes, one implementation (docs/design.md names the two
papers).

`proofs/latency.py` derives these formulas and proves their properties; `proofs` imports
nothing of the package (an independent second implementation), and `tests/test_bench.py`
holds this copy equal to the proofs', exactly, on Fractions. Every function is plain
arithmetic: Fraction inputs give Fraction results.

Symbols: gamma drafts per round, alpha per-position acceptance, t_d draft time per token,
t_v one verification step, rtt the network round trip of one block, depth blocks in flight.
`alpha` is one number (i.i.d. acceptance, the papers' model) or a sequence: `alpha[i]` the
probability that draft i of a block is accepted given drafts 0..i-1 were (what the edge
measures per position); a sequence shorter than gamma repeats its last value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

Number = Fraction | int | float
Alpha = Number | Sequence[Number]


def survival(alpha: Alpha, n: int) -> list[Number]:
    """`[P(drafts 0..k-1 all accepted) for k in 0..n]`: 1, a0, a0*a1, ... (alpha^k when
    alpha is one number)."""
    if isinstance(alpha, Sequence):
        if not alpha:
            raise ValueError("alpha must hold at least one position")
        out: list[Number] = [Fraction(1) * alpha[0] ** 0]
        for k in range(n):
            out.append(out[-1] * alpha[min(k, len(alpha) - 1)])
        return out
    return [alpha**k for k in range(n + 1)]


def expected_tokens(alpha: Alpha, gamma: int) -> Number:
    """E[A] = 1 + alpha + ... + alpha^gamma: tokens per sync round, bonus included."""
    s = survival(alpha, gamma)
    return sum(s, Fraction(0) * s[0])


def sync_token_time(gamma: int, alpha: Alpha, t_d: Number, rtt: Number, t_v: Number) -> Number:
    """Sync edge-cloud: a round drafts, waits a round trip and a verification, commits E[A]."""
    return (gamma * t_d + rtt + t_v) / expected_tokens(alpha, gamma)


def colocated_token_time(gamma: int, alpha: Alpha, t_d: Number, t_v: Number) -> Number:
    """Co-located speculative decoding: the sync round without the network."""
    return sync_token_time(gamma, alpha, t_d, 0 * t_d, t_v)


def pipelined_token_time(
    gamma: int, alpha: Alpha, t_d: Number, rtt: Number, t_v: Number, depth: int
) -> Number:
    """Pipelined edge-cloud, expected time per token (renewal-reward over blocks).

    A fully accepted block (probability alpha^gamma) costs the steady-state spacing of the
    pipeline, max(gamma*t_d, t_v, (rtt + t_v)/depth); a block with a rejection flushes the
    pipeline and costs a whole sync round. A block commits sum_{i<gamma} alpha^i tokens (no
    bonus while drafts keep coming).
    """
    full = survival(alpha, gamma)[gamma]
    spacing = max(gamma * t_d, t_v, (rtt + t_v) / Fraction(depth))
    restart = gamma * t_d + rtt + t_v
    tokens = expected_tokens(alpha, gamma - 1)
    return (full * spacing + (1 - full) * restart) / tokens


def capacity_factor(gamma: int, t_d: Number, t_v: Number) -> Number:
    """Paper B: with drafts offloaded, a saturated server spends t_v per client round instead
    of gamma*t_d + t_v, so it sustains (1 + gamma*t_d/t_v)x the clients at the same rate."""
    return 1 + gamma * t_d / t_v


def best_gamma(
    mode: str,
    alpha: Alpha,
    t_d: Number | Callable[[int], Number],
    rtt: Number,
    t_v: Number,
    *,
    depth: int = 1,
    longest: int,
) -> int:
    """The gamma in 1..longest with the least expected time per token for `mode` ("sync",
    "pipelined" or "colocated"); ties go to the shorter block. `t_d` may be a function of
    gamma (draft time per token when drafting a block of gamma: a fixed cost per block makes
    short blocks dearer per token)."""
    if longest < 1:
        raise ValueError(f"longest must be >= 1, got {longest}")

    def cost(g: int) -> Number:
        td = t_d(g) if callable(t_d) else t_d
        if mode == "pipelined":
            return pipelined_token_time(g, alpha, td, rtt, t_v, depth)
        if mode == "sync":
            return sync_token_time(g, alpha, td, rtt, t_v)
        if mode == "colocated":
            return colocated_token_time(g, alpha, td, t_v)
        raise ValueError(f"unknown mode {mode!r}")

    return min(range(1, longest + 1), key=lambda g: (cost(g), g))
