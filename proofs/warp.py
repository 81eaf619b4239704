"""Exact warping of a distribution: logit bias, temperature, min-p, top-k, top-p, in this
order (docs/design.md §3).

Distributions are lists of `Fraction` over a vocabulary of size V. The tie rules are
fixed by the project and every implementation (the JAX sampler included) must agree:

- logit bias b on token x multiplies its unnormalized probability by e^b; here the factor
  w = e^b is given as a positive Fraction (a bias of ln 2 is the weight 2), then renormalized.
  It comes first, so greedy decoding sees it too.
- min-p (min_p = 0: off): after temperature, keep every token whose probability is >=
  min_p times the largest (ties at the threshold kept; the argmax always stays); renormalize.

- temperature 0: greedy, a one-hot at the argmax; ties go to the LOWEST index.
- temperature 1/n (n a positive integer): p**n renormalized (exact and rational);
  temperature 1 is the identity. Any other temperature is not exactly representable
  here and raises `ValueError`.
- top-k (k = 0 or k >= V: off): keep every token whose probability is >= the k-th
  largest probability, so ties at the boundary are ALL kept; renormalize.
- top-p (top_p = 1: off): keep token x iff the total probability of the tokens whose
  probability is STRICTLY greater than p(x) is < top_p; renormalize. Tied tokens are
  kept or dropped together and the argmax is always kept.

Penalties act on logits, so they have a logit-level form (`penalize`, `softmax2`): logits
are exact rationals in units of ln 2 (a logit l weighs 2**l), and the exponential is
EXACT, not bounded: `softmax2` requires every weight 2**l to be rational, i.e. every
(penalized, biased) logit an integer, and raises `ValueError` otherwise. Temperature 1/n
then stays p**n. In natural units (the JAX code's) a logit l here is l * ln 2, and the
presence and frequency penalties scale the same way; the repetition penalty, a ratio, is
the same number in both.

- repetition_penalty r (> 0; HF/vLLM: tokens of the prompt OR the output so far): a seen
  token's logit l becomes l / r if l > 0, else l * r.
- frequency_penalty f and presence_penalty e (OpenAI/vLLM: output tokens only): then
  l - f * count - e * (count > 0).

The draft encodings (docs/design.md §3) use `sparse_topk` (the edge's top-k renormalized q,
exactly k survivors, ties to the lowest index) and `onehot` (greedy drafting).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

Dist = list[Fraction]


def check_dist(p: Sequence[Fraction], name: str = "distribution") -> Dist:
    """Return `p` as a list of Fractions; raise ValueError unless it is a distribution."""
    out = [Fraction(x) for x in p]
    if not out:
        raise ValueError(f"{name} is empty")
    if any(x < 0 for x in out):
        raise ValueError(f"{name} has a negative entry: {out}")
    if sum(out) != 1:
        raise ValueError(f"{name} does not sum to 1: {out}")
    return out


def normalize(w: Sequence[Fraction]) -> Dist:
    """Scale non-negative weights to sum to 1 (raise ValueError on zero total mass)."""
    total = sum(w, Fraction(0))
    if total <= 0:
        raise ValueError("cannot normalize zero mass")
    return [Fraction(x) / total for x in w]


def argmax(p: Sequence[Fraction]) -> int:
    """Index of the largest entry; ties go to the lowest index (greedy decoding's rule)."""
    best = 0
    for i, x in enumerate(p):
        if x > p[best]:
            best = i
    return best


def onehot(d: int, vocab: int) -> Dist:
    """The distribution that puts all mass on token `d` (greedy / top-1 drafting)."""
    if not 0 <= d < vocab:
        raise ValueError(f"token {d} outside vocabulary of size {vocab}")
    return [Fraction(int(i == d)) for i in range(vocab)]


def apply_temperature(p: Sequence[Fraction], temperature: Fraction | int) -> Dist:
    """Temperature 0 -> one-hot argmax; temperature 1/n -> p**n renormalized."""
    p = check_dist(p)
    t = Fraction(temperature)
    if t == 0:
        return onehot(argmax(p), len(p))
    if t < 0:
        raise ValueError(f"temperature must be >= 0, got {t}")
    power = 1 / t
    if power.denominator != 1:
        raise ValueError(f"exact warping needs temperature 0 or 1/n, got {t}")
    if power == 1:
        return p
    return normalize([x ** int(power) for x in p])


def apply_top_k(p: Sequence[Fraction], k: int) -> Dist:
    """Keep every token with probability >= the k-th largest (boundary ties kept)."""
    p = check_dist(p)
    if k < 0:
        raise ValueError(f"top_k must be >= 0, got {k}")
    if k == 0 or k >= len(p):
        return p
    threshold = sorted(p, reverse=True)[k - 1]
    return normalize([x if x >= threshold else Fraction(0) for x in p])


def apply_top_p(p: Sequence[Fraction], top_p: Fraction | int) -> Dist:
    """Keep x iff the mass of tokens strictly more likely than x is < top_p."""
    p = check_dist(p)
    top_p = Fraction(top_p)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_p == 1:
        return p
    keep = [sum((y for y in p if y > x), Fraction(0)) < top_p for x in p]
    return normalize([x if k else Fraction(0) for x, k in zip(p, keep, strict=True)])


def apply_logit_bias(p: Sequence[Fraction], weights: Sequence[tuple[int, Fraction]]) -> Dist:
    """Multiply p(x) by w = e^bias for each `(x, w)`, renormalize (no entries: identity)."""
    p = check_dist(p)
    if not weights:
        return p
    out = list(p)
    for x, w in weights:
        if not 0 <= x < len(p) or Fraction(w) <= 0:
            raise ValueError(f"logit bias entry ({x}, {w}) outside the vocabulary or not > 0")
        out[x] *= Fraction(w)
    return normalize(out)


def apply_min_p(p: Sequence[Fraction], min_p: Fraction | int) -> Dist:
    """Keep x iff p(x) >= min_p * max(p) (ties at the threshold kept), renormalize."""
    p = check_dist(p)
    min_p = Fraction(min_p)
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    if min_p == 0:
        return p
    floor = min_p * max(p)
    return normalize([x if x >= floor else Fraction(0) for x in p])


def warp(
    p: Sequence[Fraction],
    temperature: Fraction | int = 1,
    top_k: int = 0,
    top_p: Fraction | int = 1,
    min_p: Fraction | int = 0,
    logit_bias: Sequence[tuple[int, Fraction]] = (),
) -> Dist:
    """Warp `p` exactly in the project's one order: logit bias, temperature, min-p, top-k,
    top-p."""
    tempered = apply_temperature(apply_logit_bias(p, logit_bias), temperature)
    return apply_top_p(apply_top_k(apply_min_p(tempered, min_p), top_k), top_p)


def penalize(
    logits: Sequence[Fraction],
    prompt: Sequence[int],
    output: Sequence[int],
    repetition: Fraction | int = 1,
    presence: Fraction | int = 0,
    frequency: Fraction | int = 0,
) -> list[Fraction]:
    """vLLM's penalties on exact logits (module doc); `output` lists the output tokens so
    far (order irrelevant, repeats counted)."""
    r, e, f = Fraction(repetition), Fraction(presence), Fraction(frequency)
    if r <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {r}")
    out = []
    for x, lx in enumerate(logits):
        lx = Fraction(lx)
        count = sum(1 for t in output if t == x)
        if x in prompt or count:
            lx = lx / r if lx > 0 else lx * r
        out.append(lx - f * count - e * (count > 0))
    return out


def softmax2(logits: Sequence[Fraction]) -> Dist:
    """p(x) = 2**l(x) / sum: exact; raises ValueError unless every logit is an integer."""
    ls = [Fraction(x) for x in logits]
    if any(x.denominator != 1 for x in ls):
        raise ValueError(f"exact softmax needs integer logits (units of ln 2), got {ls}")
    low = min(ls)
    return normalize([Fraction(2) ** int(x - low) for x in ls])


def log2_weight(w: Fraction) -> int:
    """The logit-level bias of a logit-bias weight w = 2**b (b an integer), exactly."""
    w = Fraction(w)
    for b in range(-64, 65):
        if Fraction(2) ** b == w:
            return b
    raise ValueError(f"a logit-level model needs bias weights 2**b, b an integer, got {w}")


def sparse_topk(q: Sequence[Fraction], k: int) -> Dist:
    """The `sparse` encoding's q: the k largest entries (ties to the lowest index), renormalized.

    Exactly k tokens survive when k <= the number of nonzero entries (fewer otherwise, as a
    zero entry carries no mass); this is the distribution the edge really samples from.
    """
    q = check_dist(q)
    if k < 1:
        raise ValueError(f"sparse k must be >= 1, got {k}")
    order = sorted(range(len(q)), key=lambda i: (-q[i], i))
    kept = set(order[:k])
    return normalize([x if i in kept else Fraction(0) for i, x in enumerate(q)])
