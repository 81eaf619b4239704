"""Co-located speculative decoding vs plain decoding: tokens/s ratio and alpha, one run.

    python tools/bench_speculative.py --target default --draft default-draft
    python tools/bench_speculative.py --tiny          # random tiny pair, seconds (CI)

Prompts are windows of the documents held out of the shipped pair's training. Both decoders
run on the same prompts in the same process, each warmed up (compiled) before it is timed
(best of the repeats); `jaxspec bench` runs the same code on more prompts. Prints a table
and writes JSON (`--json`): per configuration, plain and speculative tokens/s, their ratio,
acceptance rate alpha, tokens per round and per-position acceptance. Greedy outputs are
checked to be identical (the benchmark refuses to report a lossy speedup).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import jax

import jaxspec
from jaxspec_apps.bench import colocated
from jaxspec_apps.bench.common import heldout_stream, prompts_from


def run(
    target: jaxspec.Model,
    draft: jaxspec.Model,
    *,
    gammas: list[int],
    temperatures: list[float],
    batch: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One batch of `batch` held-out prompts (`jaxspec_apps.bench.colocated.run` does the work)."""
    prompts = prompts_from(heldout_stream(target), batch, prompt_len, seed)
    return colocated.run(
        target, draft, prompts, gammas=gammas, temperatures=temperatures,
        new_tokens=new_tokens, repeats=repeats, batch=batch, seed=seed,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--draft", default="default-draft")
    p.add_argument("--tiny", action="store_true", help="random tiny pair, tiny sizes (CI)")
    p.add_argument("--gammas", default="2,4")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args(argv)
    if a.tiny:
        from jaxspec.testing import tiny_config

        cfg = tiny_config()
        target = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        noisy = jax.tree.map(lambda x: x * 1.05, target.params)
        draft = target.with_params(noisy)
        a.new_tokens, a.repeats, a.prompt_len = min(a.new_tokens, 16), 1, 8
    else:
        target, draft = jaxspec.load(a.target), jaxspec.load(a.draft)
    rows = run(
        target,
        draft,
        gammas=[int(g) for g in a.gammas.split(",")],
        temperatures=[float(t) for t in a.temperatures.split(",")],
        batch=a.batch,
        prompt_len=a.prompt_len,
        new_tokens=a.new_tokens,
        repeats=a.repeats,
    )
    print(f"{'temp':>5} {'gamma':>5} {'mode':>9} {'plain tok/s':>11} {'spec tok/s':>10} "
          f"{'speedup':>7} {'alpha':>6} {'tok/round':>9}")  # fmt: skip
    for r in rows:
        print(
            f"{r['temperature']:>5} {r['gamma']:>5} {r['mode']:>9} {r['plain_tok_s']:>11.1f} "
            f"{r['spec_tok_s']:>10.1f} {r['speedup']:>6.2f}x {r['alpha']:>6.3f} "
            f"{r['tokens_per_round']:>9.2f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
