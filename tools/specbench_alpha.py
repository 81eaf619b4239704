#!/usr/bin/env python
"""Acceptance of drafts of SmolLM2 on the bench's Spec-Bench prompts: exact counts, no timing.

For each draft (a name `jaxspec.load` knows, or a checkpoint directory) it runs co-located
speculative decoding (`jaxspec.generate(target, prompt, n, draft=..., gamma=4, mode="sync")`,
stop tokens ignored, seed 0) on every prompt of `jaxspec_apps.bench.specbench.PROMPTS`, one
prompt at a time (batch 1, as the bench's specbench section does), at each temperature, and
prints accepted / drafted summed over the prompts. At T = 0 it also asserts that the
speculative tokens equal plain greedy decoding. The counts depend on no timing, so a shared
machine gives the same figures as a quiet one.

    python tools/specbench_alpha.py --drafts smollm2-w4a16
    python tools/specbench_alpha.py --drafts ~/.cache/jaxspec/models/smollm2-135m-instruct-w4a16
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import jaxspec  # noqa: E402
from jaxspec.figures import AcceptanceFigures  # noqa: E402
from jaxspec_apps.bench import specbench  # noqa: E402


def measure(
    target: jaxspec.Model,
    draft: jaxspec.Model,
    prompts: list[list[int]],
    new_tokens: int,
    gamma: int,
    temperature: float,
    plain: list[list[int]] | None,
) -> AcceptanceFigures:
    """The summed figures of one speculative run per prompt; at T = 0 each run's tokens are
    checked against `plain` (the target's greedy tokens)."""
    total = AcceptanceFigures()
    for i, p in enumerate(prompts):
        out = jaxspec.generate(
            target, [p], new_tokens, draft=draft, gamma=gamma, temperature=temperature,
            seed=0, stop_tokens=(), mode="sync",
        )  # fmt: skip
        if plain is not None:
            assert list(out.tokens[0]) == plain[i], f"prompt {i}: speculative != plain greedy"
        total = total + out.stats.figures
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--drafts", nargs="+", default=["smollm2-w4a16"])
    p.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts per category")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    args = p.parse_args(argv)
    target = jaxspec.load(args.target)
    prompts = [q for ps in specbench.category_prompts(target, args.per_category).values()
               for q in ps]  # fmt: skip
    greedy = dict(temperature=0.0, stop_tokens=())
    plain = [
        list(jaxspec.generate(target, [q], args.new_tokens, **greedy).tokens[0]) for q in prompts
    ]
    for name in args.drafts:
        draft = jaxspec.load(str(pathlib.Path(name).expanduser()) if "/" in name else name)
        for t in args.temperatures:
            t0 = time.perf_counter()
            f = measure(target, draft, prompts, args.new_tokens, args.gamma, t,
                        plain if t == 0.0 else None)  # fmt: skip
            row = {
                "draft": name, "temperature": t, "prompts": len(prompts),
                "new_tokens": args.new_tokens, "gamma": args.gamma,
                "accepted": f.num_accepted_tokens, "drafted": f.num_draft_tokens,
                "alpha": round(f.acceptance_rate, 4),
                "tokens_per_round": round(f.tokens_per_round, 3),
                "greedy_equal": t == 0.0,
                "seconds_on_a_shared_machine": round(time.perf_counter() - t0),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
