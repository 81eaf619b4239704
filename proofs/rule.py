"""The verification rule of docs/design.md §3 as exact functions on Fractions.

Written to be compared step by step with the float implementation: the same strict
accept test `u * q[d] < p[d]`, the same residual (with the same zero-mass fallback) and
the same inverse-CDF sampling convention (the first index whose cumulative sum exceeds
u, so a zero-probability token is never chosen). A float64 uniform converts exactly with
`Fraction(float)`.

Exact probabilities used by the enumeration, for u uniform on [0, 1):
- P(accept) = |{u : u * q[d] < p[d]}| = min(1, p[d] / q[d])           (`accept_prob`)
- P(sample(dist, u) == i) = dist[i]                                      (`sample`)
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from proofs.warp import Dist, argmax, check_dist, normalize


def check_draft(p: Sequence[Fraction], q: Sequence[Fraction], d: int) -> tuple[Dist, Dist]:
    """Validate (p, q, d); a bad q or a draft with q[d] = 0 is invalid input, not a reject."""
    p = check_dist(p, "p")
    q = check_dist(q, "q")
    if len(p) != len(q):
        raise ValueError(f"p and q differ in size: {len(p)} != {len(q)}")
    if not 0 <= d < len(q):
        raise ValueError(f"draft token {d} outside vocabulary of size {len(q)}")
    if q[d] == 0:
        raise ValueError(f"draft token {d} has q[d] = 0: it cannot have been sampled from q")
    return p, q


def accept_prob(p: Sequence[Fraction], q: Sequence[Fraction], d: int) -> Fraction:
    """min(1, p[d] / q[d]): the measure of the uniforms u in [0, 1) with u * q[d] < p[d]."""
    p, q = check_draft(p, q, d)
    return min(Fraction(1), p[d] / q[d])


def residual(p: Sequence[Fraction], q: Sequence[Fraction]) -> Dist:
    """norm(max(0, p - q)); p itself when that has zero mass (p == q: nothing to correct)."""
    p = check_dist(p, "p")
    q = check_dist(q, "q")
    if len(p) != len(q):
        raise ValueError(f"p and q differ in size: {len(p)} != {len(q)}")
    excess = [max(Fraction(0), a - b) for a, b in zip(p, q, strict=True)]
    if sum(excess) == 0:
        return p
    return normalize(excess)


def sample(dist: Sequence[Fraction], u: Fraction) -> int:
    """Inverse-CDF sample: the first index i with cumsum(dist)[i] > u, for u in [0, 1)."""
    dist = check_dist(dist)
    u = Fraction(u)
    if not 0 <= u < 1:
        raise ValueError(f"uniform must lie in [0, 1), got {u}")
    total = Fraction(0)
    for i, x in enumerate(dist):
        total += x
        if total > u:
            return i
    raise AssertionError("unreachable: a distribution's cumsum reaches 1 > u")


def accepts(p: Sequence[Fraction], q: Sequence[Fraction], d: int, u_accept: Fraction) -> bool:
    """The accept test: u * q[d] < p[d] (strict: p[d] = 0 never accepts, even at u = 0)."""
    p, q = check_draft(p, q, d)
    return Fraction(u_accept) * q[d] < p[d]


def decide(
    p: Sequence[Fraction],
    q: Sequence[Fraction],
    d: int,
    u_accept: Fraction,
    u_residual: Fraction,
) -> tuple[bool, int]:
    """One position of verification: (True, d) on accept, else (False, residual sample).

    `q` must be the distribution the edge really sampled `d` from (after warping and
    encoding); `u_accept` and `u_residual` are the position's ACCEPT and RESIDUAL uniforms.
    """
    if accepts(p, q, d, u_accept):
        return True, d
    return False, sample(residual(p, q), u_residual)


def greedy_decide(p: Sequence[Fraction], d: int) -> tuple[bool, int]:
    """Temperature 0 as stated in docs/design.md §3: accept iff d == argmax p, else emit argmax p.

    Not used by the enumeration: tests check that `decide` on a one-hot warped p agrees.
    """
    best = argmax(check_dist(p, "p"))
    return d == best, best
