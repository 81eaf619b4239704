"""Spec-Bench's report on the real pair: per prompt category, at T = 0 and batch 1, the mean
accepted tokens per round (tokens committed per verification, the bonus token included),
the speedup over plain decoding and the acceptance at each draft position.

The prompts are written here, not drawn from the distillation's prompt builder, so no
training prompt can be among them (Spec-Bench's own categories, reduced to five that a 135M
instruct model answers: coding, explanation, summarization of a given text, math word
problems, rewriting). Greedy speculative tokens must equal plain greedy tokens
(`GreedyMismatch`); both decoders are timed in turns after a warm-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jaxspec
from jaxspec.decoding import costs
from jaxspec.nn.text import chat_prompt, encode_prompt
from jaxspec_apps.bench.colocated import pooled
from jaxspec_apps.bench.common import best_time, check_same_tokens
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (Spec-Bench prompts per category).
Config = sizes("specbench_", per_category=3, new_tokens=128)


QUICK_SIZES = Config(per_category=1, new_tokens=16)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=8)

PROMPTS: dict[str, tuple[str, ...]] = {
    "coding": (
        "Write a Python function that returns the n-th Fibonacci number.",
        "Write a Python function that counts the vowels in a string.",
        "Write a Python class for a stack with push, pop and peek methods.",
    ),
    "explanation": (
        "Explain what a hash table is and why lookups are fast.",
        "Explain the difference between a process and a thread.",
        "Explain what recursion is, with a short example.",
    ),
    "summarization": (
        "Summarize in two sentences: The city council met on Tuesday to discuss the new bike "
        "lanes. Residents on Main Street complained that parking spaces would be lost, while "
        "cyclists said the lanes would make the road safer. The council voted to build the "
        "lanes on two streets first and to review the results after one year.",
        "Summarize in two sentences: Honeybees live in colonies of up to sixty thousand bees. "
        "A single queen lays the eggs, worker bees collect nectar and pollen, and drones mate "
        "with queens from other colonies. In winter the workers cluster together and shiver "
        "to keep the queen warm.",
        "Summarize in one sentence: The library will close for three weeks in August while "
        "the heating system is replaced. Books can be returned at the town hall during that "
        "time, and the reading room will reopen with new chairs and longer opening hours.",
    ),
    "math": (
        "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain step "
        "by step.",
        "Anna is 4 years older than her brother. In 6 years the sum of their ages will be "
        "30. How old is Anna now? Explain step by step.",
        "A tank holds 200 litres and a pump fills 8 litres per minute. How long does it take "
        "to fill the tank from a quarter full? Explain step by step.",
    ),
    "rewriting": (
        "Rewrite this sentence to be more formal: hey, the meeting got moved to friday "
        "cause the boss is out.",
        "Rewrite this paragraph in simple words for a child: Photosynthesis is the process "
        "by which plants convert light energy into chemical energy stored in glucose.",
        "Rewrite this sentence in the passive voice: The committee approved the new budget "
        "after a long debate.",
    ),
}
CATEGORIES = tuple(PROMPTS)


def prompt_ids(model: Any, text: str) -> list[int]:
    """The chat-formatted prompt (plain text when the model has no chat template)."""
    try:
        return list(chat_prompt(model, text))
    except ValueError:
        return list(encode_prompt(model, text))


def category_prompts(model: Any, per_category: int) -> dict[str, list[list[int]]]:
    """The first `per_category` prompts of each category, as token ids."""
    return {c: [prompt_ids(model, t) for t in ps[:per_category]] for c, ps in PROMPTS.items()}


def run(
    target: Any,
    draft: Any,
    prompts: dict[str, Sequence[Sequence[int]]],
    *,
    new_tokens: int,
    gamma: int,
    repeats: int,
    auto: bool = True,
) -> dict[str, Any]:
    """One row per category and one over all: plain and speculative tokens/s (T = 0, batch
    1, sync, stop tokens ignored so every answer is `new_tokens` long), the speedup, alpha,
    mean accepted tokens per round and per-position acceptance; at the fixed `gamma`, and
    (`auto`) beside it at `gamma="auto"` with the gammas it picked."""
    common = dict(temperature=0.0, stop_tokens=(), seed=0)
    kinds = {"fixed": gamma, **({"auto": "auto"} if auto else {})}
    every = {k: _totals() for k in kinds}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for category, ps in prompts.items():
        cat = {k: _totals() for k in kinds}
        for i, p in enumerate(ps):
            p = [int(t) for t in p]
            t_plain, plain = best_time(
                lambda p=p: jaxspec.generate(target, p, new_tokens, **common), repeats
            )
            for kind, g in kinds.items():
                t_spec, spec = best_time(
                    lambda p=p, g=g: jaxspec.generate(
                        target, p, new_tokens, draft=draft, gamma=g, mode="sync", **common
                    ),
                    repeats,
                )
                check_same_tokens(f"specbench {category} prompt {i} ({kind})", spec.tokens,
                                  plain.tokens)  # fmt: skip
                for t in (cat[kind], every[kind]):
                    t["prompts"] += 1
                    t["plain_s"] += t_plain
                    t["spec_s"] += t_spec
                    t["tokens"] += plain.stats.new_tokens
                    t["stats"].append(spec.stats)
        for kind in kinds:
            rows[kind].append(_row(category, cat[kind]))
    out = {"gamma": gamma, "new_tokens": new_tokens, "rows": rows["fixed"],
           "overall": _row("overall", every["fixed"])}  # fmt: skip
    if auto:
        out["auto"] = {"rows": rows["auto"], "overall": _row("overall", every["auto"])}
    out["parts"] = parts(target, draft, gamma, out["overall"])
    return out


def parts(target: Any, draft: Any, gamma: int, overall: dict[str, Any]) -> dict[str, Any]:
    """What the forwards allow: each forward a round is made of, timed inside a jitted loop
    (`jaxspec.decoding.costs`: no dispatch), and the speedup a round of exactly those
    forwards would give at the measured tokens per round: E[A] x t(target [1, 1]) / ((gamma -
    f) t(draft [1, 1]) + f t(draft [1, 2]) + t(target [1, gamma + 1])), f the share of rounds
    whose first draft forward also feeds the previous token (those after a bonus)."""
    d = costs.forward_seconds(draft, (1, 2))
    v = costs.forward_seconds(target, (1, gamma + 1))
    f = overall["per_position_acceptance"][-1]  # rounds fully accepted: a bonus follows
    round_s = (gamma - f) * d[1] + f * d[2] + v[gamma + 1]
    return {
        "draft_s": d[1], "draft2_s": d[2], "target_s": v[1], "verify_s": v[gamma + 1],
        "feed_prev_share": f, "round_s": round_s,
        "speedup": overall["tokens_per_round"] * v[1] / round_s,
    }  # fmt: skip


def _totals() -> dict[str, Any]:
    return {"prompts": 0, "tokens": 0, "plain_s": 0.0, "spec_s": 0.0, "stats": []}


def _row(category: str, t: dict[str, Any]) -> dict[str, Any]:
    """A table row from the totals `t` (prompts, tokens, plain_s, spec_s, the speculative
    runs' stats) of a category, or of all of them; `gammas`: the gamma of each run."""
    figures = pooled([s for s in t["stats"] if s.figures is not None])
    return {
        "category": category,
        "prompts": t["prompts"],
        "new_tokens": t["tokens"],
        "plain_tok_s": t["tokens"] / t["plain_s"],
        "spec_tok_s": t["tokens"] / t["spec_s"],
        "speedup": t["plain_s"] / t["spec_s"],
        "tokens_per_round": figures["tokens_per_round"],
        "gammas": [s.gamma for s in t["stats"]],
        **figures,
    }


def run_section(ctx: Context) -> dict[str, Any]:
    """Every category's prompts, T = 0, sync."""
    p = ctx.p
    return run(
        ctx.target, ctx.draft, ctx.by_category, new_tokens=p.specbench.new_tokens,
        gamma=p.gamma, repeats=p.repeats,
    )  # fmt: skip


SECTION = Section("specbench", run_section)
