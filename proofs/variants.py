"""The correct rule and deliberately wrong variants of it (mutants), selectable by name.

A `Variant` is read by the enumerator (`proofs.enumerate`) at each point where a real
implementation could go wrong. `CORRECT` is docs/design.md §3; every entry of `MUTANTS` is a bug
users report in speculative decoders, and the proof must reject each one. `CONTROLS` are
variants that look suspicious but are provably lossless: the proof must accept them, which
shows that catching the mutants is not the proof failing on everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from proofs.rule import check_draft, residual, sample
from proofs.warp import Dist, check_dist

Correction = Callable[[Dist, Dist], Dist]


def unnormalized_residual(p: Sequence[Fraction], q: Sequence[Fraction]) -> Dist:
    """Law of `argmax(cumsum(max(0, p - q)) > u)` WITHOUT normalizing the residual.

    The cumsum only reaches 1 - sum(min(p, q)), so for larger u no index qualifies and
    argmax of an all-False mask returns 0: the missing mass lands on token 0.
    """
    p, q = check_dist(p, "p"), check_dist(q, "q")
    excess = [max(Fraction(0), a - b) for a, b in zip(p, q, strict=True)]
    excess[0] += 1 - sum(excess)
    return excess


def residual_from_p(p: Sequence[Fraction], q: Sequence[Fraction]) -> Dist:
    """The correction drawn from p itself instead of the residual."""
    del q
    return check_dist(p, "p")


@dataclass(frozen=True)
class Variant:
    """How one verifier behaves at each point where an implementation can go wrong.

    Fields:
      name: registry key.
      correction: law of the token emitted on a reject, from (p, q).
      strict_accept: accept iff u*q < p (True) or u*q <= p (False).
      bonus_source: "p" (correct), "q" (bonus drawn from the draft's q).
      bonus_offset: 0, or -1 for the bonus drawn from p one position too early.
      rule_q_unwarped: the verifier's q is the draft's UNwarped q (edge sampled warped q).
      rule_q_without_options: the verifier's q is warped without the logit bias and min-p
        (the edge sampled from q with them): the options applied on one side only.
      shared_accept_uniform: one accept uniform for a whole block instead of one per
        position (the uniform of position t reused at t+1).
      draft_counts_stale: the edge's penalties do not count the block's own earlier drafts
        (it still sends the q it sampled from: lossless, but fewer drafts accepted).
      counts_not_rolled_back: the verifier's penalty counts keep a block's rejected drafts.
      stale_policy: "drop" (correct), "rescored" (stale blocks verified against the new
        prefix with q as of the new prefix), "honest" (stale blocks verified with the q they
        were really drafted from: a lossless control).
      how: a sentence on what is wrong, for the report.
    """

    name: str
    correction: Correction = residual
    strict_accept: bool = True
    bonus_source: str = "p"
    bonus_offset: int = 0
    rule_q_unwarped: bool = False
    rule_q_without_options: bool = False
    shared_accept_uniform: bool = False
    draft_counts_stale: bool = False
    counts_not_rolled_back: bool = False
    stale_policy: str = "drop"
    how: str = "docs/design.md §3"


CORRECT = Variant(name="correct")

MUTANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        replace(
            CORRECT,
            name="unnormalized_residual",
            correction=unnormalized_residual,
            how="correction = argmax(cumsum(max(0, p-q)) > u): unnormalized, excess on 0",
        ),
        replace(
            CORRECT,
            name="warp_p_not_q",
            rule_q_unwarped=True,
            how="verifier uses the unwarped q while the edge sampled from warped q",
        ),
        replace(
            CORRECT,
            name="options_p_not_q",
            rule_q_without_options=True,
            how="logit bias and min-p applied where p is warped, left out of the q the "
            "verifier pairs with the drafts (the edge sampled them from q with the options)",
        ),
        replace(
            CORRECT,
            name="bonus_from_q",
            bonus_source="q",
            how="bonus token drawn from the draft's warped q instead of p",
        ),
        replace(
            CORRECT,
            name="residual_from_p",
            correction=residual_from_p,
            how="correction drawn from p instead of norm(max(0, p - q))",
        ),
        replace(
            CORRECT,
            name="stale_block_accepted",
            stale_policy="rescored",
            how="verifier skips the epoch check: a stale block whose start matches is "
            "verified against the new prefix, with q as of the new prefix, and committed",
        ),
        replace(
            CORRECT,
            name="off_by_one_bonus",
            bonus_offset=-1,
            how="bonus drawn from p at the last draft's position (logits[k-1], not [k])",
        ),
        replace(
            CORRECT,
            name="reused_uniform",
            shared_accept_uniform=True,
            how="the accept uniform of position t reused at t+1 inside a block",
        ),
        replace(
            CORRECT,
            name="counts_not_rolled_back",
            counts_not_rolled_back=True,
            how="the verifier's penalty counts are not rolled back on a rejection: the "
            "rejected (and untested) drafts of the block stay counted",
        ),
        replace(
            CORRECT,
            name="draft_counts_stale",
            draft_counts_stale=True,
            how="the edge's penalty counts do not see the block's own earlier drafts; it "
            "sends the q it sampled from, so the law is unchanged (rejection sampling is "
            "exact for any q) but the acceptance drops: caught by the expected tokens per "
            "round with q == p (every draft must be accepted)",
        ),
        replace(
            CORRECT,
            name="nonstrict_accept",
            strict_accept=False,
            how="accept iff u*q <= p: at u = 0 a token with p = 0 is accepted",
        ),
    )
}

CONTROLS: dict[str, Variant] = {
    "stale_block_honest_q": replace(
        CORRECT,
        name="stale_block_honest_q",
        stale_policy="honest",
        how="stale block verified with the q it was really drafted from: lossless, since "
        "rejection sampling is exact for ANY proposal independent of the position's "
        "ACCEPT/RESIDUAL draws; dropping stale blocks is for the KV cache and efficiency",
    ),
}


def variant(name: str | None) -> Variant:
    """Look a variant up by name (None or "correct" -> CORRECT)."""
    if name is None or name == "correct":
        return CORRECT
    if name in MUTANTS:
        return MUTANTS[name]
    if name in CONTROLS:
        return CONTROLS[name]
    raise KeyError(f"unknown variant {name!r}; mutants: {sorted(MUTANTS)}")


def variant_decide(
    v: Variant,
    p: Sequence[Fraction],
    q: Sequence[Fraction],
    d: int,
    u_accept: Fraction,
    u_residual: Fraction,
) -> tuple[bool, int]:
    """`rule.decide` as variant `v` would run it (equal to `rule.decide` for CORRECT)."""
    p, q = check_draft(p, q, d)
    lhs = Fraction(u_accept) * q[d]
    if lhs < p[d] or (not v.strict_accept and lhs == p[d]):
        return True, d
    return False, sample(v.correction(p, q), u_residual)
