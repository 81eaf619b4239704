"""The papers' analytical latency/capacity model, exact on Fractions (docs/design.md names
the two papers).

Every function is plain arithmetic, so Fraction (or int) inputs give exact Fraction
results and floats give floats. Times are per block or per token in any one unit; t_network
is the round-trip network time of one block and its answer.
"""

from __future__ import annotations

from fractions import Fraction

Number = Fraction | int | float


def t_sync(gamma: int, t_draft: Number, t_network: Number, t_verify: Number) -> Number:
    """One synchronous round: draft gamma tokens, send and wait, verify (strictly additive)."""
    _check_gamma(gamma)
    return gamma * t_draft + t_network + t_verify


def expected_tokens(alpha: Number, gamma: int) -> Number:
    """E[A] = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per sync round, bonus included.

    With i.i.d. per-position acceptance alpha, the round commits k + 1 tokens when the
    first k drafts are accepted and then either a rejection's correction or (k = gamma)
    the bonus, so E[A] = sum_{i=0}^{gamma} alpha^i; at alpha = 1 that is gamma + 1.
    """
    _check_gamma(gamma)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 1:
        return gamma + 1
    return _div(1 - alpha ** (gamma + 1), 1 - alpha)


def sync_token_time(
    gamma: int, alpha: Number, t_draft: Number, t_network: Number, t_verify: Number
) -> Number:
    """Expected time per token in sync mode: t_sync / E[A]."""
    return _div(t_sync(gamma, t_draft, t_network, t_verify), expected_tokens(alpha, gamma))


def pipelined_block_time(
    gamma: int, t_draft: Number, t_network: Number, t_verify: Number, depth: int = 1
) -> Number:
    """Steady-state time between blocks in pipelined mode (no rejections).

    Derivation. Let c be the time between consecutive blocks in steady state.
    (1) The edge drafts one block at a time: c >= gamma * t_draft.
    (2) The verifier handles a tenant's blocks one at a time: c >= t_verify.
    (3) A block holds one of `depth` in-flight slots from its send until its answer
        returns, t_network + t_verify later; by Little's law depth >= (t_network +
        t_verify) / c, so c >= (t_network + t_verify) / depth.
    Drafting the next block while the current ones are in flight and sending it as soon as
    a slot frees attains the largest of the three bounds:

        c = max(gamma * t_draft, t_verify, (t_network + t_verify) / depth).

    At depth 1 this is max(gamma * t_draft, t_network + t_verify): the slowest of the two
    parallel stages, edge drafting vs. the verify + network round trip. It never exceeds
    `t_sync` (a max of terms is at most their sum). Paper A states the balance point as
    T_verify ~ gamma*T_draft + T_network, charging the network to the edge; in this model
    (the round trip holds the slot) the depth-1 balance point is gamma*t_draft =
    t_network + t_verify.
    """
    _check_gamma(gamma)
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    return max(gamma * t_draft, t_verify, _div(t_network + t_verify, depth))


def pipelined_token_time(
    gamma: int, t_draft: Number, t_network: Number, t_verify: Number, depth: int = 1
) -> Number:
    """Lower bound on the pipelined time per token: block time / gamma.

    Pipelined mode has no bonus, so a block commits at most gamma tokens, exactly gamma
    when all drafts are accepted (the bound is attained at alpha = 1); a rejection flushes
    the blocks in flight and only adds time.
    """
    return _div(pipelined_block_time(gamma, t_draft, t_network, t_verify, depth), gamma)


def pipelined_expected_token_time(
    gamma: int,
    alpha: Number,
    t_draft: Number,
    t_network: Number,
    t_verify: Number,
    depth: int = 1,
) -> Number:
    """Expected pipelined time per token with i.i.d. per-position acceptance alpha.

    A block is fully accepted with probability alpha^gamma and then costs the steady-state
    block time c (`pipelined_block_time`). Otherwise the blocks in flight are flushed and
    the edge restarts from the correction: drafting, the round trip and verification are
    strictly sequential again, so that block costs t_sync. Tokens per block are
    E[min(first rejection + 1, gamma)] = sum_{i<gamma} alpha^i = (1 - alpha^gamma)/(1 - alpha)
    (no bonus in pipelined mode). Time per token is the ratio of the two expectations
    (renewal-reward). At alpha = 1 it is `pipelined_token_time`; at alpha = 0 it is t_sync.
    """
    full = alpha**gamma
    block = pipelined_block_time(gamma, t_draft, t_network, t_verify, depth)
    restart = t_sync(gamma, t_draft, t_network, t_verify)
    tokens = gamma if alpha == 1 else _div(1 - full, 1 - alpha)
    return _div(full * block + (1 - full) * restart, tokens)


def colocated_token_time(gamma: int, alpha: Number, t_draft: Number, t_verify: Number) -> Number:
    """Co-located speculative decoding (draft and target on the server, no network inside
    a round): (gamma * t_draft + t_verify) / E[A]."""
    return _div(gamma * t_draft + t_verify, expected_tokens(alpha, gamma))


def capacity_gain(gamma: int, t_draft: Number, t_verify: Number) -> Number:
    """Paper B: a saturated server sustains (1 + gamma * t_d / t_v)x more clients with DSD.

    Co-located, the server spends gamma * t_d + t_v per round of a client; with the draft
    on the edge it spends t_v, so the same server time serves (gamma*t_d + t_v) / t_v
    times as many clients at the same per-client rate.
    """
    _check_gamma(gamma)
    if t_verify <= 0:
        raise ValueError(f"t_verify must be > 0, got {t_verify}")
    return 1 + _div(gamma * t_draft, t_verify)


def _check_gamma(gamma: int) -> None:
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")


def _div(a: Number, b: Number) -> Number:
    """a / b, exact (a Fraction) unless a float is involved."""
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    return Fraction(a) / b
