"""The proof suites behind `python -m proofs`: losslessness, closed forms, mutants.

Each suite returns a `Result` (counts of what was proved, and failures). Everything is
deterministic given the `random.Random` passed in.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction

from proofs import latency
from proofs.cases import (
    OPTION_PARAMS,
    PARAMS,
    PENALTY_PARAMS,
    Q_KINDS,
    Case,
    random_case,
    random_dist,
    random_logit_case,
)
from proofs.enumerate import ENCODINGS, Params, Spec, law_difference, mean_length, round_law
from proofs.rule import accept_prob, decide, greedy_decide, residual
from proofs.variants import CONTROLS, MUTANTS, variant_decide
from proofs.warp import Dist, apply_top_k, apply_top_p, argmax, onehot, sparse_topk, warp

F = Fraction
GAMMAS = (1, 2, 3, 4)
DEPTHS = (1, 2, 3)


@dataclass(frozen=True)
class Profile:
    """How much to enumerate.

    Fields:
      shapes: (V, N) pairs the lossless cases draw from.
      deep_n: every other lossless case uses V = 2 and N = min(deep_n, gamma*max(depth-1, 1)
        + 2), so that several rounds, `depth` blocks in flight and stale drops all occur
        even for large gamma.
      per_combo: cases per mode x encoding x gamma (x depth).
      closed_form_cases, greedy_cases, control_cases: sizes of those suites.
      mutant_attempts: random cases tried per mutant and mode before giving up.
    """

    shapes: tuple[tuple[int, int], ...]
    deep_n: int
    per_combo: int
    closed_form_cases: int
    greedy_cases: int
    mutant_attempts: int
    control_cases: int


_SMALL = ((2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3))
PROFILES = {
    "fast": Profile(_SMALL, 6, 4, 10, 100, 300, 30),
    "full": Profile(
        (*_SMALL, (2, 4), (3, 4), (4, 1), (4, 2), (4, 3), (4, 4)), 9, 64, 100, 1000, 1000, 200
    ),
}


@dataclass
class Result:
    """What a suite proved: counters of checked cases, notes, and failures (must be empty)."""

    counts: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def lossless_suite(rng: random.Random, profile: Profile) -> Result:
    """Speculative law == target law, exactly, for every mode x encoding x gamma (x depth).

    Draft kinds and params cycle through Q_KINDS and PARAMS (coprime lengths), so every
    pair (p == q, one-hot q, zeros, full support) x (greedy, T = 1/2, top-k, top-p, ...)
    occurs.
    """
    res = Result()
    stats: Counter[str] = Counter()
    i = 0
    for mode in ("sync", "pipelined"):
        for encoding in ENCODINGS:
            for gamma in GAMMAS:
                for depth in DEPTHS if mode == "pipelined" else (1,):
                    spec = Spec(mode=mode, gamma=gamma, encoding=encoding, depth=depth)
                    for j in range(profile.per_combo):
                        vocab, n = rng.choice(profile.shapes)
                        if j % 2:
                            vocab, n = 2, min(profile.deep_n, gamma * max(depth - 1, 1) + 2)
                        case = random_case(
                            rng,
                            spec,
                            vocab,
                            n,
                            q_kind=Q_KINDS[i % len(Q_KINDS)],
                            params=PARAMS[i % len(PARAMS)],
                        )
                        i += 1
                        _lossless_case(case, res, stats)
    for key, value in sorted(stats.items()):
        res.counts[f"(distinct states) {key}"] = value
    return res


def _lossless_case(case: Case, res: Result, stats: Counter[str]) -> None:
    """Check one case and count what it covered."""
    spec = case.spec
    seen: Counter[str] = Counter()
    tv, seq = law_difference(case.law(stats=seen), case.target())
    stats.update(seen)
    res.counts[f"{spec.mode} x {spec.encoding}"] += 1
    res.counts[f"{spec.mode} gamma={spec.gamma}"] += 1
    if spec.mode == "pipelined":
        res.counts[f"pipelined depth={spec.depth}"] += 1
        if seen[f"drafted with {spec.depth - 1} block(s) in flight"]:
            res.counts[f"pipelined depth={spec.depth}: {spec.depth} blocks in flight at once"] += 1
        if seen["stale blocks dropped"]:
            res.counts["pipelined: a stale block dropped"] += 1
    elif seen["bonus draws"]:
        res.counts["sync: a bonus drawn"] += 1
    if seen["drafts with p(d)=0 (always rejected)"]:
        res.counts["cases with a draft p(d)=0 (always rejected)"] += 1
    for tag in case.tags:
        res.counts[f"tag {tag}"] += 1
    if tv:
        res.failures.append(f"NOT lossless: {case.describe()} TV={tv} at {seq}")


def penalty_suite(rng: random.Random, profile: Profile) -> Result:
    """Penalties, exactly: logit-level cases (exact logits, every PENALTY_PARAMS entry) are
    lossless in every mode x encoding x gamma (x depth)."""
    res = Result()
    stats: Counter[str] = Counter()
    i = 0
    for mode in ("sync", "pipelined"):
        for encoding in ENCODINGS:
            for gamma in (1, 2, 3):
                for depth in (1, 2) if mode == "pipelined" else (1,):
                    spec = Spec(mode=mode, gamma=gamma, encoding=encoding, depth=depth)
                    for _ in range(max(1, profile.per_combo // 2)):
                        vocab, n = rng.choice(((2, 2), (2, 3), (3, 2), (3, 3)))
                        params = PENALTY_PARAMS[i % len(PENALTY_PARAMS)]
                        i += 1
                        _lossless_case(
                            random_logit_case(rng, spec, vocab, n, params=params), res, stats
                        )
    for key, value in sorted(stats.items()):
        res.counts[f"(distinct states) {key}"] = value
    return res


def stale_counts_check() -> tuple[bool, str]:
    """`draft_counts_stale` keeps the law (its q is the one it sampled from) but not the
    acceptance: with q == p (the draft is the target) every draft must be accepted, so a
    sync round of gamma 2 commits exactly 3 tokens; the mutant's commits fewer."""
    logits = [F(2), F(0)]
    params = Params(presence_penalty=F(2))
    spec = Spec(gamma=2)
    model = _const(logits)  # type: ignore[arg-type]
    want = mean_length(round_law(model, model, 2, params, spec, logits=True))
    got = mean_length(
        round_law(model, model, 2, params, spec, mutant="draft_counts_stale", logits=True)
    )
    return want == 3 and got < 3, (
        f"q == p (logits [2, 0], presence 2, gamma 2): E[tokens per round] correct {want}, "
        f"mutant {got}"
    )


def greedy_suite(rng: random.Random, profile: Profile) -> Result:
    """Temperature 0 falls out of the general rule: accept iff d == argmax p, else argmax p."""
    res = Result()
    for _ in range(profile.greedy_cases):
        vocab = rng.randint(2, 4)
        p, q = random_dist(rng, vocab), random_dist(rng, vocab)
        p0, q0 = warp(p, 0), warp(q, rng.choice((0, F(1, 2), 1)))
        best = argmax(p)
        for d in (x for x in range(vocab) if q0[x]):
            u = F(rng.randrange(1000), 1000)
            want = greedy_decide(p0, d)
            got = decide(p0, q0, d, u, F(rng.randrange(1000), 1000))
            a = accept_prob(p0, q0, d)
            if got != want or a != (d == best):
                res.failures.append(f"T=0: p={p} q={q0} d={d}: decide {got}, want {want}")
            if d != best and residual(p0, q0) != onehot(best, vocab):
                res.failures.append(f"T=0: residual of p={p} q={q0} is not one-hot at {best}")
            res.counts["T=0 decisions checked"] += 1
    return res


def closed_form_suite(rng: random.Random, profile: Profile) -> Result:
    """E[tokens per sync round] by enumerating one round == (1 - a^(g+1)) / (1 - a).

    p and q are the same at every prefix, so the acceptance probability of every position
    is alpha = sum_x min(p(x), q(x)) with q the sampled (encoded) draft distribution;
    for a one-hot draft d = argmax q that is p(d).
    """
    res = Result()
    for i in range(profile.closed_form_cases):
        vocab = rng.randint(2, 4)
        p = random_dist(rng, vocab)
        q = list(p) if i % 5 == 0 else random_dist(rng, vocab, zeros=i % 2 == 0)
        params = PARAMS[i % len(PARAMS)]
        pw, qw = params.apply(p), params.apply(q)
        for encoding in ENCODINGS:
            for gamma in GAMMAS:
                spec = Spec(gamma=gamma, encoding=encoding, sparse_k=1 + i % (vocab - 1))
                qe = {"full": qw, "sparse": sparse_topk(qw, spec.sparse_k)}.get(
                    encoding, onehot(argmax(qw), vocab)
                )
                alpha = sum((min(a, b) for a, b in zip(pw, qe, strict=True)), F(0))
                if encoding == "onehot" and alpha != pw[argmax(qw)]:
                    res.failures.append(f"onehot alpha {alpha} != p(d) for p={pw} q={qw}")
                got = mean_length(round_law(_const(p), _const(q), vocab, params, spec))
                want = latency.expected_tokens(alpha, gamma)
                if got != want:
                    res.failures.append(
                        f"E[A] {got} != {want}: alpha={alpha} gamma={gamma} {encoding} p={p} q={q}"
                    )
                res.counts[f"closed form {encoding}"] += 1
                if alpha == 1:
                    res.counts["closed form alpha=1 (gamma+1)"] += 1
    return res


def _const(dist: Dist) -> Callable[[tuple], Dist]:
    """A model that gives `dist` after every prefix (i.i.d. acceptance)."""
    return lambda _prefix: dist


# (function, input, argument, expected): the project's tie rules on hand-made examples.
WARP_EXAMPLES: tuple[tuple[str, list[Fraction], object, list[Fraction]], ...] = (
    ("temperature", [F(1, 4), F(3, 8), F(3, 8)], 0, [F(0), F(1), F(0)]),  # lowest index
    ("temperature", [F(1, 3), F(2, 3)], F(1, 2), [F(1, 5), F(4, 5)]),  # p^2 renormalized
    ("temperature", [F(1, 3), F(2, 3)], 1, [F(1, 3), F(2, 3)]),
    ("top_k", [F(2, 5), F(1, 5), F(1, 5), F(1, 5)], 2, [F(2, 5), F(1, 5), F(1, 5), F(1, 5)]),
    ("top_k", [F(1, 2), F(1, 3), F(1, 6)], 2, [F(3, 5), F(2, 5), F(0)]),
    ("top_k", [F(1, 2), F(1, 3), F(1, 6)], 0, [F(1, 2), F(1, 3), F(1, 6)]),
    ("top_p", [F(1, 2), F(1, 4), F(1, 4)], F(1, 2), [F(1), F(0), F(0)]),  # 1/2 not < 1/2
    ("top_p", [F(1, 2), F(1, 4), F(1, 4)], F(3, 4), [F(1, 2), F(1, 4), F(1, 4)]),
    ("top_p", [F(2, 5), F(2, 5), F(1, 5)], F(1, 100), [F(1, 2), F(1, 2), F(0)]),  # tied max
    ("sparse_topk", [F(1, 4)] * 4, 2, [F(1, 2), F(1, 2), F(0), F(0)]),
    ("sparse_topk", [F(1, 6), F(1, 3), F(1, 3), F(1, 6)], 3, [F(1, 5), F(2, 5), F(2, 5), F(0)]),
    ("sparse_topk", [F(1, 2), F(1, 2), F(0)], 3, [F(1, 2), F(1, 2), F(0)]),
    # The order is temperature, then top-k, then top-p; the other orders give other results.
    ("warp", [F(1, 2), F(1, 4), F(1, 4)], (F(1, 2), 0, F(3, 5)), [F(1), F(0), F(0)]),
    ("warp", [F(1, 2), F(1, 4), F(1, 8), F(1, 8)], (1, 2, F(3, 5)), [F(1), F(0), F(0), F(0)]),
)


def apply_example(name: str, p: list[Fraction], arg: object) -> Dist:
    """Run one WARP_EXAMPLES entry."""
    if name == "temperature":
        return warp(p, temperature=arg)  # type: ignore[arg-type]
    if name == "top_k":
        return apply_top_k(p, arg)  # type: ignore[arg-type]
    if name == "top_p":
        return apply_top_p(p, arg)  # type: ignore[arg-type]
    if name == "sparse_topk":
        return sparse_topk(p, arg)  # type: ignore[arg-type]
    return warp(p, *arg)  # type: ignore[misc]


def warp_suite() -> Result:
    """The hand-made tie-rule examples."""
    res = Result()
    for name, p, arg, want in WARP_EXAMPLES:
        got = apply_example(name, p, arg)
        res.counts["warping examples"] += 1
        if got != want:
            res.failures.append(f"{name}({p}, {arg}) = {got}, want {want}")
    return res


# Modes in which each mutant is meaningful (the bonus exists only in sync mode, stale
# blocks only in pipelined mode).
MUTANT_MODES: dict[str, tuple[str, ...]] = {
    "unnormalized_residual": ("sync", "pipelined"),
    "warp_p_not_q": ("sync", "pipelined"),
    "options_p_not_q": ("sync", "pipelined"),
    "bonus_from_q": ("sync",),
    "residual_from_p": ("sync", "pipelined"),
    "stale_block_accepted": ("pipelined",),
    "off_by_one_bonus": ("sync",),
    "reused_uniform": ("sync", "pipelined"),
    "nonstrict_accept": (),
    "counts_not_rolled_back": ("sync", "pipelined"),
    "draft_counts_stale": (),  # lossless by design: caught by `stale_counts_check`
}
# Mutants that need a logit-level case with penalties to show.
PENALTY_MUTANTS = ("counts_not_rolled_back",)


def mutant_spec(rng: random.Random, name: str, mode: str) -> Spec:
    """A random spec in which mutant `name` can show (gamma >= 2 for a shared uniform...)."""
    gamma = rng.randint(2 if name == "reused_uniform" else 1, 3)
    depth = rng.randint(2 if name == "stale_block_accepted" else 1, 3)
    encoding = rng.choice(("full", "full", "sparse", "onehot"))
    return Spec(mode=mode, gamma=gamma, encoding=encoding, depth=depth)


def find_counterexample(
    rng: random.Random, name: str, mode: str, attempts: int
) -> tuple[Case, Fraction, tuple, int] | None:
    """The first random case whose law under mutant `name` differs from the target's."""
    for attempt in range(1, attempts + 1):
        # A stale block shows only after a rejection at a block's end; full-support q
        # makes that likely and keeps the rescored q(d) > 0.
        q_kind = "full_support" if name == "stale_block_accepted" else None
        spec = mutant_spec(rng, name, mode)
        # The options mutant can only show where a case uses min-p or a logit bias.
        params = rng.choice(OPTION_PARAMS) if name == "options_p_not_q" else None
        shape = (rng.choice((2, 3)), rng.choice((2, 3)))
        if name in PENALTY_MUTANTS:
            case = random_logit_case(rng, spec, *shape)
        else:
            case = random_case(rng, spec, *shape, q_kind=q_kind, params=params)
        try:
            tv, seq = case.difference(name)
        except ValueError:  # the mutant paired a draft with q(d) = 0: not a clean catch
            continue
        if tv:
            return case, tv, seq, attempt
    return None


def nonstrict_check() -> tuple[bool, str]:
    """u = 0, p(d) = 0: the correct rule rejects; `nonstrict_accept` accepts the token."""
    p, q, d = [F(0), F(1)], [F(1, 2), F(1, 2)], 0
    correct = decide(p, q, d, F(0), F(0))
    mutated = variant_decide(MUTANTS["nonstrict_accept"], p, q, d, F(0), F(0))
    caught = correct == (False, 1) and mutated == (True, 0)
    shown = ", ".join
    return caught, (
        f"deterministic check: decide(p=[{shown(map(str, p))}], q=[{shown(map(str, q))}], "
        f"d={d}, u=0) -> correct {correct}, mutant {mutated} (accepts a token p gives 0)"
    )


def mutant_suite(rng: random.Random, profile: Profile) -> Result:
    """Every mutant must be caught, in every mode where it applies."""
    res = Result()
    caught, how = stale_counts_check()
    blind = sum(
        random_logit_case(rng, Spec(mode=mode, gamma=2, depth=2), 2, 3).difference(
            "draft_counts_stale"
        )[0]
        == 0
        for mode in ("sync", "pipelined")
        for _ in range(5)
    )
    res.notes.append(
        f"draft_counts_stale caught by {how}; its law equals the target in {blind}/10 "
        "logit-level cases, as it must (the q it sends is the q it sampled from)"
    )
    if caught and blind == 10:
        res.counts["mutant draft_counts_stale caught"] += 1
    else:
        res.failures.append(f"mutant draft_counts_stale: caught={caught}, blind={blind}/10")
    for name in MUTANTS:
        for mode in MUTANT_MODES[name]:
            found = find_counterexample(rng, name, mode, profile.mutant_attempts)
            if found is None:
                res.failures.append(f"mutant {name} ({mode}) NOT caught")
                continue
            case, tv, seq, attempt = found
            want, got = case.target().get(seq, F(0)), case.law(name).get(seq, F(0))
            res.notes.append(
                f"{name} [{mode}] caught by exact enumeration (attempt {attempt}): "
                f"{case.describe()}: P{seq} = {got} vs target {want}, TV = {tv}"
            )
            res.counts[f"mutant {name} caught"] += 1
    # nonstrict_accept differs only on a measure-zero set: enumeration cannot see it.
    blind = 0
    for _ in range(10):
        spec = Spec(mode=rng.choice(("sync", "pipelined")), gamma=rng.randint(1, 3))
        case = random_case(rng, replace(spec, depth=rng.randint(1, 3)), 2, 2, p_zeros=True)
        blind += case.difference("nonstrict_accept")[0] == 0
    caught, how = nonstrict_check()
    res.notes.append(
        f"nonstrict_accept caught by {how}; exact enumeration equals the target in "
        f"{blind}/10 cases, as it must (u*q == p has probability 0)"
    )
    if caught and blind == 10:
        res.counts["mutant nonstrict_accept caught"] += 1
    else:
        res.failures.append(f"mutant nonstrict_accept: caught={caught}, blind={blind}/10")
    return res


def control_suite(rng: random.Random, profile: Profile) -> Result:
    """Controls are lossless: stale blocks verified with their honest q change nothing."""
    res = Result()
    for name in CONTROLS:
        exercised = 0
        for _ in range(profile.control_cases):
            spec = Spec(mode="pipelined", gamma=rng.randint(1, 3), depth=rng.randint(2, 3))
            spec = replace(spec, encoding=rng.choice(ENCODINGS))
            case = random_case(rng, spec, rng.choice((2, 3)), rng.choice((2, 3)))
            stats: Counter[str] = Counter()
            tv, seq = law_difference(case.law(name, stats=stats), case.target())
            exercised += stats["stale blocks verified (not dropped)"] > 0
            res.counts[f"control {name} cases"] += 1
            if tv:
                res.failures.append(f"control {name} NOT lossless: {case.describe()} {seq}")
        res.counts[f"control {name} cases verifying a stale block"] = exercised
        if not exercised:
            res.failures.append(f"control {name}: no case verified a stale block")
    return res


def run_all(profile_name: str = "fast", seed: int = 0) -> dict[str, Result]:
    """Every suite, in order, with one seeded generator."""
    profile = PROFILES[profile_name]
    rng = random.Random(seed)
    return {
        "warping tie rules": warp_suite(),
        "temperature 0": greedy_suite(rng, profile),
        "lossless": lossless_suite(rng, profile),
        "penalties (logit level)": penalty_suite(rng, profile),
        "closed form E[A]": closed_form_suite(rng, profile),
        "mutants": mutant_suite(rng, profile),
        "controls": control_suite(rng, profile),
    }
