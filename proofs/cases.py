"""Test cases for the exact proofs: tables of small-denominator rational distributions.

A `Case` bundles target and draft tables (prefix -> distribution, for every prefix shorter
than N), sampling params and a speculative spec. `random_case` draws one from a
`random.Random`, putting zeros, ties, p == q and one-hot q in on purpose.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction

from proofs.enumerate import Law, Params, Seq, Spec, law_difference, speculative_law, target_law
from proofs.warp import Dist, onehot

Table = dict[Seq, Dist]

# Sampling params the random cases draw from: identity, greedy, temperature 1/2 and 1/3,
# top-k with boundary ties, top-p, min-p, logit bias (as e^bias weights), and combinations;
# OPTION_PARAMS are the ones with min-p or a logit bias.
PARAMS: tuple[Params, ...] = (
    Params(),
    Params(temperature=Fraction(0)),
    Params(temperature=Fraction(1, 2)),
    Params(top_k=1),
    Params(top_k=2),
    Params(top_p=Fraction(1, 2)),
    Params(top_p=Fraction(3, 4)),
    Params(temperature=Fraction(1, 2), top_k=2, top_p=Fraction(3, 4)),
    Params(temperature=Fraction(1, 3), top_p=Fraction(9, 10)),
    *(
        OPTION_PARAMS := (
            Params(min_p=Fraction(1, 2)),
            Params(logit_bias=((0, Fraction(3)),)),
            Params(logit_bias=((1, Fraction(1, 4)), (0, Fraction(2)))),
            Params(temperature=Fraction(0), logit_bias=((1, Fraction(5)),)),
            Params(
                temperature=Fraction(1, 2), min_p=Fraction(1, 3), logit_bias=((1, Fraction(2)),)
            ),
            Params(min_p=Fraction(1, 4), top_k=2, top_p=Fraction(3, 4)),
        )
    ),
)

Q_KINDS = ("independent", "equal", "onehot", "zeros", "full_support")

# Penalties, for logit-level cases (logits in units of ln 2, `proofs.warp`): repetition 2
# and 1/2 (even logits keep every penalized logit an integer: the exponential stays
# exact), presence and frequency in whole units, both signs, with the other options.
F = Fraction
PENALTY_PARAMS: tuple[Params, ...] = (
    Params(repetition_penalty=F(2), prompt=(0,)),
    Params(repetition_penalty=F(1, 2)),
    Params(presence_penalty=F(1)),
    Params(frequency_penalty=F(1)),
    Params(frequency_penalty=F(-1), presence_penalty=F(2)),
    Params(repetition_penalty=F(2), presence_penalty=F(1), frequency_penalty=F(1), prompt=(1,)),
    Params(temperature=F(0), repetition_penalty=F(2), frequency_penalty=F(2)),
    Params(temperature=F(1, 2), top_k=2, presence_penalty=F(1), prompt=(0,)),
    Params(top_p=F(3, 4), min_p=F(1, 4), repetition_penalty=F(2), logit_bias=((1, F(4)),)),
)
# Logit values of the logit-level tables: even, so that r = 2 and 1/2 keep them integers.
LOGITS = (-4, -2, 0, 2, 4)


@dataclass(frozen=True)
class Case:
    """One exact check: tables p and q over `vocab` tokens, N = `n`, params and spec."""

    vocab: int
    n: int
    p: Table
    q: Table
    params: Params
    spec: Spec
    tags: frozenset[str] = field(default_factory=frozenset)
    logits: bool = False  # the tables hold exact logits (units of ln 2), not distributions

    def target(self) -> Law:
        """The autoregressive law of warped p."""
        return target_law(self.p.__getitem__, self.vocab, self.n, self.params, self.logits)

    def law(self, mutant: str | None = None, stats: Counter[str] | None = None) -> Law:
        """The law speculative decoding (variant `mutant`) produces."""
        return speculative_law(
            self.p.__getitem__,
            self.q.__getitem__,
            self.vocab,
            self.n,
            self.params,
            self.spec,
            mutant=mutant,
            stats=stats,
            logits=self.logits,
        )

    def difference(self, mutant: str | None = None) -> tuple[Fraction, Seq | None]:
        """(total variation distance to the target, a sequence where they differ)."""
        return law_difference(self.law(mutant), self.target())

    def describe(self) -> str:
        s, pr = self.spec, self.params
        depth = f" depth={s.depth}" if s.mode == "pipelined" else ""
        k = f" k={s.sparse_k}" if s.encoding == "sparse" else ""
        return (
            f"{s.mode} {s.encoding}{k} gamma={s.gamma}{depth} V={self.vocab} N={self.n} "
            f"T={pr.temperature} top_k={pr.top_k} top_p={pr.top_p} min_p={pr.min_p} "
            f"bias={list(pr.logit_bias)} "
            + (
                f"logits rep={pr.repetition_penalty} pres={pr.presence_penalty} "
                f"freq={pr.frequency_penalty} prompt={pr.prompt} "
                if self.logits
                else ""
            )
            + f"[{', '.join(sorted(self.tags))}]"
        )


def prefixes(vocab: int, n: int) -> list[Seq]:
    """Every prefix of length < n, shortest first."""
    return [pre for k in range(n) for pre in itertools.product(range(vocab), repeat=k)]


def random_dist(rng: random.Random, vocab: int, zeros: bool = True) -> Dist:
    """Small integer weights (0..3, or 1..3 without zeros) normalized: zeros and ties."""
    weights = [rng.randint(0 if zeros else 1, 3) for _ in range(vocab)]
    if not any(weights):
        weights[rng.randrange(vocab)] = 1
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


def random_table(rng: random.Random, vocab: int, n: int, zeros: bool = True) -> Table:
    """A random model: an independent random distribution at every prefix."""
    return {pre: random_dist(rng, vocab, zeros) for pre in prefixes(vocab, n)}


def draft_table(rng: random.Random, p: Table, vocab: int, kind: str) -> Table:
    """A draft table related to p by `kind` (one of Q_KINDS)."""
    if kind == "equal":
        return dict(p)
    if kind == "onehot":
        return {pre: onehot(rng.randrange(vocab), vocab) for pre in p}
    return {pre: random_dist(rng, vocab, zeros=kind != "full_support") for pre in p}


def has_ties(table: Table) -> bool:
    """Whether some distribution has two equal positive entries."""
    return any(len({x for x in d if x}) < sum(1 for x in d if x) for d in table.values())


def random_case(
    rng: random.Random,
    spec: Spec,
    vocab: int,
    n: int,
    q_kind: str | None = None,
    params: Params | None = None,
    p_zeros: bool | None = None,
) -> Case:
    """A random case for `spec`; unset choices are drawn from `rng`."""
    p_zeros = rng.random() < 0.5 if p_zeros is None else p_zeros
    q_kind = rng.choice(Q_KINDS) if q_kind is None else q_kind
    params = rng.choice(PARAMS) if params is None else params
    p = random_table(rng, vocab, n, zeros=p_zeros)
    q = draft_table(rng, p, vocab, q_kind)
    tags = {f"q:{q_kind}"}
    if any(0 in d for d in p.values()):
        tags.add("zeros in p")
    if any(0 in d for d in q.values()):
        tags.add("zeros in q")
    if has_ties(p) or has_ties(q):
        tags.add("ties")
    if params.temperature == 0:
        tags.add("T=0")
    elif params.temperature != 1:
        tags.add(f"T={params.temperature}")
    if params.top_k:
        tags.add("top-k")
    if params.top_p != 1:
        tags.add("top-p")
    if params.min_p:
        tags.add("min-p")
    if params.logit_bias:
        tags.add("logit-bias")
    if spec.encoding == "sparse":
        spec = replace(spec, sparse_k=rng.randint(1, vocab - 1))
    return Case(vocab, n, p, q, params, spec, frozenset(tags))


def random_logits(rng: random.Random, vocab: int) -> list[Fraction]:
    """Exact logits (units of ln 2) drawn from LOGITS: ties are common."""
    return [Fraction(rng.choice(LOGITS)) for _ in range(vocab)]


def random_logit_case(
    rng: random.Random,
    spec: Spec,
    vocab: int,
    n: int,
    q_kind: str | None = None,
    params: Params | None = None,
) -> Case:
    """A logit-level case (penalties): target and draft logit tables, q "equal" (the same
    table), "independent" or "close" (p's logits, one entry moved by 2)."""
    q_kind = rng.choice(("independent", "equal", "close")) if q_kind is None else q_kind
    params = rng.choice(PENALTY_PARAMS) if params is None else params
    pre = prefixes(vocab, n)
    p = {x: random_logits(rng, vocab) for x in pre}
    if q_kind == "equal":
        q = dict(p)
    elif q_kind == "close":
        q = {}
        for x, ls in p.items():
            moved = list(ls)
            moved[rng.randrange(vocab)] += rng.choice((-2, 2))
            q[x] = moved
    else:
        q = {x: random_logits(rng, vocab) for x in pre}
    if spec.encoding == "sparse":
        spec = replace(spec, sparse_k=rng.randint(1, vocab - 1))
    tags = frozenset({f"q:{q_kind}", "penalties"})
    return Case(vocab, n, p, q, params, spec, tags, logits=True)
