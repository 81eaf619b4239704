"""Exact enumeration of speculative decoding's output distribution (sync and pipelined).

A *model* maps a prefix (tuple of token ids) to a distribution over V tokens. Target p
and draft q are warped with the same sampling params (temperature, top-k, top-p); the q
the edge really samples drafts from is then the *encoding* of warped q:

    full   -> warped q
    sparse -> sparse_topk(warped q, k)
    onehot -> one-hot at argmax(warped q)      (greedy drafting)

A model may instead give exact logits (`logits=True`; units of ln 2, see `proofs.warp`):
then the penalties apply too. Their counts are the prompt's tokens (`Params.prompt`) and
the output path itself: the verifier's p at position t reads the committed tokens plus the
block's drafts before t, and the edge's q the same path (its own earlier drafts included).
Two mutants move those counts: `draft_counts_stale` (the edge's q forgets the block's own
drafts; the q it sends is the one it sampled from) and `counts_not_rolled_back` (the
verifier keeps counting the rejected drafts of a block: `ghost` tokens).

Every branch of the process (draft draws, accept tests, residual draws, bonus draws) is
followed with its exact probability until N new tokens are committed; the result is the
law of the first N output tokens as {tuple: Fraction}. Losslessness is the EXACT equality
of that law with `target_law`, the autoregressive law of warped p.

Truncation at N: a round drafts only the positions below N. Drafts and a bonus at positions
>= N would be drawn from their own position-keyed draws after every decision below N was
made, so the tokens below N are the same functions of the same draws with or without them:
dropping them is an exact marginalization, not an approximation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from proofs.rule import accept_prob
from proofs.variants import Variant, variant
from proofs.warp import (
    Dist,
    argmax,
    check_dist,
    log2_weight,
    onehot,
    penalize,
    softmax2,
    sparse_topk,
    warp,
)

Seq = tuple[int, ...]
Law = dict[Seq, Fraction]
Model = Callable[[Seq], Sequence[Fraction]]

MODES = ("sync", "pipelined")
ENCODINGS = ("full", "sparse", "onehot")


@dataclass(frozen=True)
class Params:
    """Sampling params, applied to p and q alike (logit bias, temperature, min-p, top-k,
    top-p; `logit_bias` as `(token, e^bias)` pairs, see `proofs.warp`)."""

    temperature: Fraction = Fraction(1)
    top_k: int = 0
    top_p: Fraction = Fraction(1)
    min_p: Fraction = Fraction(0)
    logit_bias: tuple[tuple[int, Fraction], ...] = ()
    repetition_penalty: Fraction = Fraction(1)
    presence_penalty: Fraction = Fraction(0)
    frequency_penalty: Fraction = Fraction(0)
    prompt: tuple[int, ...] = ()

    def apply(self, p: Sequence[Fraction], options: bool = True) -> Dist:
        """Warped p; `options=False` leaves out the logit bias and min-p (a mutant's q)."""
        if not options:
            return warp(p, self.temperature, self.top_k, self.top_p)
        return warp(p, self.temperature, self.top_k, self.top_p, self.min_p, self.logit_bias)

    def apply_logits(
        self, logits: Sequence[Fraction], output: Sequence[int], options: bool = True
    ) -> Dist:
        """Warped distribution of exact logits (units of ln 2) after the output `output`:
        logit bias, penalties, then temperature, min-p, top-k, top-p as `apply`."""
        ls = [Fraction(x) for x in logits]
        if options:
            for x, w in self.logit_bias:
                ls[x] += log2_weight(w)
        ls = penalize(
            ls, self.prompt, output, self.repetition_penalty, self.presence_penalty,
            self.frequency_penalty,
        )  # fmt: skip
        return replace(self, logit_bias=()).apply(softmax2(ls), options)

    @property
    def penalized(self) -> bool:
        r, e, f = self.repetition_penalty, self.presence_penalty, self.frequency_penalty
        return r != 1 or e != 0 or f != 0

    @property
    def has_options(self) -> bool:
        return self.min_p != 0 or bool(self.logit_bias)


@dataclass(frozen=True)
class Spec:
    """Speculative-decoding configuration: mode, gamma, draft encoding, pipeline depth."""

    mode: str = "sync"
    gamma: int = 1
    encoding: str = "full"
    depth: int = 1
    sparse_k: int = 2

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.gamma < 1 or self.depth < 1 or self.sparse_k < 1:
            raise ValueError(f"gamma, depth and sparse_k must be >= 1: {self}")


class _Models:
    """Warped and encoded distributions per path, cached; what a variant's verifier sees.

    With a logit-level model (`logits`) and penalties, a distribution also depends on the
    tokens counted: `counted`, the output tokens the penalties read (the path itself unless
    a mutant says otherwise)."""

    def __init__(
        self,
        p: Model,
        q: Model,
        vocab: int,
        params: Params,
        spec: Spec,
        v: Variant,
        logits: bool = False,
    ) -> None:
        self._p_model, self._q_model = p, q
        self.vocab, self.params, self.spec, self.v = vocab, params, spec, v
        self.logits = logits
        self._cache: dict[tuple[str, Seq, Seq], Dist] = {}
        self.stats: Counter[str] = Counter()

    def _raw(self, which: str, path: Seq) -> Dist:
        got = (self._p_model if which == "p" else self._q_model)(path)
        dist = [Fraction(x) for x in got] if self.logits else check_dist(got, which)
        if len(dist) != self.vocab:
            raise ValueError(f"{which}({path}) has size {len(dist)}, expected {self.vocab}")
        return dist

    def _warped(self, which: str, path: Seq, counted: Seq, options: bool = True) -> Dist:
        if self.logits:
            return self.params.apply_logits(self._raw(which, path), counted, options)
        return self.params.apply(self._raw(which, path), options)

    def _encode(self, q: Dist) -> Dist:
        if self.spec.encoding == "sparse":
            return sparse_topk(q, self.spec.sparse_k)
        if self.spec.encoding == "onehot":
            return onehot(argmax(q), self.vocab)
        return q

    def _counted(self, tokens: Seq) -> Seq:
        """The memo key of a multiset of counted tokens (() when nothing reads counts)."""
        return tuple(sorted(tokens)) if self.logits and self.params.penalized else ()

    def _get(self, kind: str, path: Seq, counted: Seq) -> Dist:
        key = (kind, path, self._counted(counted))
        if key not in self._cache:
            if kind == "p":
                dist = self._warped("p", path, counted)
            elif kind == "q_warped":
                dist = self._warped("q", path, counted)
            elif kind == "q_sample":
                dist = self._encode(self._warped("q", path, counted))
            elif self.v.rule_q_without_options:  # "q_rule": warped without bias / min-p
                dist = self._encode(self._warped("q", path, counted, options=False))
            else:  # "q_rule"
                raw = self.v.rule_q_unwarped
                if raw and self.logits:
                    dist = self._encode(softmax2(self._raw("q", path)))
                elif raw:
                    dist = self._encode(self._raw("q", path))
                else:
                    dist = self._get("q_sample", path, counted)
            self._cache[key] = dist
        return self._cache[key]

    def _draft_counted(self, path: Seq, base: Seq | None) -> Seq:
        """What the edge's penalties count at `path`, in a block drafted after `base`: the
        whole path (mutant `draft_counts_stale`: the block's own drafts left out)."""
        return base if self.v.draft_counts_stale and base is not None else path

    def p(self, path: Seq, ghost: Seq = ()) -> Dist:
        """Warped target distribution at `path` (the verifier's counts: path + `ghost`)."""
        return self._get("p", path, path + ghost)

    def q_warped(self, path: Seq) -> Dist:
        """Warped draft distribution at `path`."""
        return self._get("q_warped", path, path)

    def q_sample(self, path: Seq, base: Seq | None = None) -> Dist:
        """The q the edge really samples its draft from at `path` (warped, then encoded),
        in a block drafted after `base`."""
        return self._get("q_sample", path, self._draft_counted(path, base))

    def q_rule(self, path: Seq, base: Seq | None = None) -> Dist:
        """The q the verifier pairs with a draft at `path` (== q_sample unless mutated)."""
        return self._get("q_rule", path, self._draft_counted(path, base))


def _mix(out: Law, weight: Fraction, law: Law) -> None:
    """out += weight * law."""
    for seq, pr in law.items():
        out[seq] = out.get(seq, Fraction(0)) + weight * pr


def _draft_block(m: _Models, base: Seq, length: int) -> list[tuple[Seq, Fraction]]:
    """All draft blocks of `length` tokens after `base`, each draft drawn from q_sample."""
    blocks: list[tuple[Seq, Fraction]] = [((), Fraction(1))]
    for _ in range(length):
        blocks = [
            ((*drafts, x), w * qx)
            for drafts, w in blocks
            for x, qx in enumerate(m.q_sample(base + drafts, base))
            if qx
        ]
    return blocks


QFor = Callable[[int, Seq], Dist]


def _verify_block(
    m: _Models, committed: Seq, drafts: Seq, q_for: QFor, ghost: Seq = ()
) -> list[tuple[Seq, bool, Fraction]]:
    """Verify `drafts` left to right after `committed`: [(new tokens, rejected, prob)].

    The verifier's penalties count the path and `ghost` (tokens a mutant forgot to roll
    back; empty when correct).

    Each position j uses p at the verification path and `q_for(j, path)`; it accepts with
    probability min(1, p/q) and on a reject emits a correction and stops. With a shared
    accept uniform (mutant `reused_uniform`) u is followed as a uniform on an interval
    [lo, hi) of [0, 1): the partition at the breakpoints min(1, p/q) of the positions
    that share it, so the coupling between positions is exact.
    """
    v = m.v
    out: list[tuple[Seq, bool, Fraction]] = []

    def go(j: int, w: Fraction, lo: Fraction, hi: Fraction) -> None:
        if j == len(drafts):
            out.append((drafts, False, w))
            return
        path = committed + drafts[:j]
        p, q = m.p(path, ghost), q_for(j, path)
        a = accept_prob(p, q, drafts[j])  # u < p/q  <=>  u < min(1, p/q) for u in [0, 1)
        m.stats["verified drafts"] += 1
        if p[drafts[j]] == 0:
            assert a == 0, "a draft the target gives probability 0 must always be rejected"
            m.stats["drafts with p(d)=0 (always rejected)"] += 1
        if v.shared_accept_uniform:
            cut = min(max(a, lo), hi)
            pa, acc = (cut - lo) / (hi - lo), (lo, cut)
        else:
            pa, acc = a, (Fraction(0), Fraction(1))
        if pa:
            go(j + 1, w * pa, *acc)
        if pa != 1:
            m.stats["rejections"] += 1
            for c, pc in enumerate(v.correction(p, q)):
                if pc:
                    out.append(((*drafts[:j], c), True, w * (1 - pa) * pc))

    go(0, Fraction(1), Fraction(0), Fraction(1))
    return out


def _bonus(m: _Models, path: Seq, ghost: Seq = ()) -> Dist:
    """The bonus law after a fully accepted block ending at `path` (p at `path` if correct)."""
    at = path[: len(path) + m.v.bonus_offset]
    return m.q_warped(at) if m.v.bonus_source == "q" else m.p(at, ghost)


def _ghost_after(m: _Models, ghost: Seq, drafts: Seq, new: Seq, rejected: bool) -> Seq:
    """The verifier's extra counted tokens after a block: none when correct; with mutant
    `counts_not_rolled_back` the rejected and untested drafts stay counted."""
    if not (rejected and m.v.counts_not_rolled_back and m.logits and m.params.penalized):
        return ghost
    return tuple(sorted(ghost + drafts[len(new) - 1 :]))


def _sync_round_ghosts(
    m: _Models, committed: Seq, limit: int | None, ghost: Seq = ()
) -> dict[tuple[Seq, Seq], Fraction]:
    """Law of (new tokens, the verifier's ghost after) of one sync round from `committed`
    (no tokens at >= limit)."""
    gamma = m.spec.gamma
    length = gamma if limit is None else min(gamma, limit - len(committed))
    out: dict[tuple[Seq, Seq], Fraction] = {}

    def add(key: tuple[Seq, Seq], w: Fraction) -> None:
        out[key] = out.get(key, Fraction(0)) + w

    for drafts, wd in _draft_block(m, committed, length):
        q_for: QFor = lambda j, path: m.q_rule(path, committed)  # noqa: E731
        for new, rejected, wv in _verify_block(m, committed, drafts, q_for, ghost):
            end = len(committed) + len(new)
            after = _ghost_after(m, ghost, drafts, new, rejected)
            if rejected or (limit is not None and end >= limit):
                add((new, after), wd * wv)
            else:
                m.stats["bonus draws"] += 1
                for b, pb in enumerate(_bonus(m, committed + new, ghost)):
                    if pb:
                        add(((*new, b), after), wd * wv * pb)
    return out


def _sync_round(m: _Models, committed: Seq, limit: int | None) -> Law:
    """Law of the new tokens of one sync round from `committed` (no tokens at >= limit)."""
    out: Law = {}
    for (new, _), w in _sync_round_ghosts(m, committed, limit).items():
        _mix(out, w, {new: Fraction(1)})
    return out


def _sync_law(m: _Models, n: int) -> Law:
    """Rounds of gamma drafts until n tokens; memoized on the committed prefix (and the
    verifier's ghost counts, empty unless a mutant keeps them)."""
    memo: dict[tuple[Seq, Seq], Law] = {}

    def run(committed: Seq, ghost: Seq) -> Law:
        if len(committed) >= n:
            return {committed[:n]: Fraction(1)}
        if (committed, ghost) not in memo:
            out: Law = {}
            for (new, after), w in _sync_round_ghosts(m, committed, n, ghost).items():
                _mix(out, w, run(committed + new, after))
            memo[(committed, ghost)] = out
        return memo[(committed, ghost)]

    return run((), ())


# Pipelined mode: an explicit state machine.
#
# State = (committed, queue). `queue` holds the blocks in flight, oldest first, as
# (stale, start, base, drafts): `base` is the edge path the block was drafted after, and
# `stale` means "of an older epoch". One step of the fixed schedule is: if fewer than
# `depth` blocks are in flight and the edge's optimistic path is shorter than N, the edge
# drafts one block of up to gamma tokens after it (committed prefix + every live draft in
# flight); otherwise the verifier takes the oldest block. It drops the block, keeping no
# trace, if the block is stale or does not start at the committed length; else it verifies
# the block position by position (no bonus). A rejection at t commits the correction c_t
# and opens a new epoch: every block still in flight becomes stale and the edge's path
# rolls back to the committed prefix, so its next block re-drafts from t + 1.
#
# Why a re-drafted position may be enumerated as a fresh q-draw although it reuses its
# DRAFT key (docs/design.md §2): the stale draft at t + 1 is never verified, so no committed
# decision depends on it. The decisions up to t depend only on the draws of positions
# <= t, which are independent of the draws of position t + 1. Conditionally on everything
# committed so far, the DRAFT uniform of t + 1 is therefore still uniform and independent,
# and the re-draft is distributed exactly as q(. | committed prefix) -- the same law the
# enumeration gives it. (The stale block itself is still enumerated: its drafts were
# drawn while it was live; with the "drop" policy its content is forgotten once stale,
# since nothing can read it any more.)

Block = tuple[bool, int, Seq, Seq]


def _edge_path(committed: Seq, queue: tuple[Block, ...]) -> Seq:
    """The edge's optimistic path: the committed prefix plus every live draft in flight."""
    path = committed
    for stale, start, base, drafts in queue:
        if not stale:
            assert start == len(path) and base == path, "live blocks must extend the path"
            path = path + drafts
    return path


def _pipelined_law(m: _Models, n: int) -> Law:
    """The pipelined state machine, memoized on its state."""
    spec, v = m.spec, m.v
    memo: dict[tuple[Seq, tuple[Block, ...], Seq], Law] = {}

    def make_stale(queue: tuple[Block, ...]) -> tuple[Block, ...]:
        if v.stale_policy == "drop":  # content can never be read again
            return tuple((True, start, (), ()) for _, start, _, _ in queue)
        return tuple((True, start, base, drafts) for _, start, base, drafts in queue)

    def verify_oldest(committed: Seq, queue: tuple[Block, ...], ghost: Seq) -> Law:
        (stale, start, base, drafts), rest = queue[0], queue[1:]
        if start != len(committed) or (stale and v.stale_policy == "drop"):
            m.stats["stale blocks dropped"] += 1
            return run(committed, rest, ghost)  # the verifier answers `stale`, keeps no trace
        if not stale:
            q_for: QFor = lambda j, path: m.q_rule(base + drafts[:j], base)  # noqa: E731
        elif v.stale_policy == "honest":
            q_for = lambda j, path: m.q_sample(base + drafts[:j], base)  # noqa: E731
        else:  # "rescored": the stale drafts paired with q at the verification path
            q_for = lambda j, path: m.q_rule(path, committed)  # noqa: E731
        if stale:
            m.stats["stale blocks verified (not dropped)"] += 1
        out: Law = {}
        for new, rejected, w in _verify_block(m, committed, drafts, q_for, ghost):
            # A rejection (or, for a mutant, committing a stale block) opens a new epoch.
            after = make_stale(rest) if rejected or stale else rest
            kept = _ghost_after(m, ghost, drafts, new, rejected)
            _mix(out, w, run(committed + new, after, kept))
        return out

    def run(committed: Seq, queue: tuple[Block, ...], ghost: Seq) -> Law:
        if len(committed) >= n:
            return {committed[:n]: Fraction(1)}
        key = (committed, queue, ghost)
        if key not in memo:
            path = _edge_path(committed, queue)
            if len(queue) < spec.depth and len(path) < n:
                m.stats["blocks drafted"] += 1
                m.stats[f"drafted with {len(queue)} block(s) in flight"] += 1
                out: Law = {}
                for drafts, w in _draft_block(m, path, min(spec.gamma, n - len(path))):
                    block = (False, len(path), path, drafts)
                    _mix(out, w, run(committed, (*queue, block), ghost))
            else:
                out = verify_oldest(committed, queue, ghost)
            memo[key] = out
        return memo[key]

    return run((), (), ())


def target_law(p: Model, vocab: int, n: int, params: Params, logits: bool = False) -> Law:
    """The autoregressive law of the first n tokens under warped p (`logits`: p gives exact
    logits, penalized by the output so far)."""

    def warped(seq: Seq) -> Dist:
        return params.apply_logits(p(seq), seq) if logits else params.apply(p(seq))

    law: Law = {(): Fraction(1)}
    for _ in range(n):
        law = {
            (*seq, x): pr * px for seq, pr in law.items() for x, px in enumerate(warped(seq)) if px
        }
    return law


def speculative_law(
    p: Model,
    q: Model,
    vocab: int,
    n: int,
    params: Params,
    spec: Spec,
    mutant: str | None = None,
    stats: Counter[str] | None = None,
    logits: bool = False,
) -> Law:
    """The exact law of the first n tokens speculative decoding commits (variant `mutant`).

    `stats`, if given, is updated with counts of the enumerated events (over distinct
    memoized states, not weighted): verified drafts, rejections, stale drops, ...
    `logits`: p and q give exact logits (units of ln 2), and the penalties apply.
    """
    m = _Models(p, q, vocab, params, spec, variant(mutant), logits)
    law = _sync_law(m, n) if spec.mode == "sync" else _pipelined_law(m, n)
    if stats is not None:
        stats.update(m.stats)
    law = {seq: pr for seq, pr in law.items() if pr}
    assert sum(law.values()) == 1, "enumeration lost probability mass"
    return law


def round_law(
    p: Model,
    q: Model,
    vocab: int,
    params: Params,
    spec: Spec,
    prefix: Seq = (),
    mutant: str | None = None,
    logits: bool = False,
) -> Law:
    """Law of the new tokens of ONE sync round after `prefix` (no length limit)."""
    m = _Models(p, q, vocab, params, spec, variant(mutant), logits)
    return {seq: pr for seq, pr in _sync_round(m, prefix, None).items() if pr}


def mean_length(law: Law) -> Fraction:
    """E[len] of a law of token sequences: of `round_law`'s, the tokens one sync round
    commits on average, exactly."""
    return sum((len(s) * pr for s, pr in law.items()), Fraction(0))


def law_difference(a: Law, b: Law) -> tuple[Fraction, Seq | None]:
    """(total variation distance, one sequence where the laws differ most) of two laws."""
    keys = sorted(set(a) | set(b))
    gaps = {k: a.get(k, Fraction(0)) - b.get(k, Fraction(0)) for k in keys}
    tv = sum((abs(g) for g in gaps.values()), Fraction(0)) / 2
    worst = max(keys, key=lambda k: abs(gaps[k]), default=None)
    return tv, (worst if tv else None)
