"""Co-located speculative decoding vs plain decoding: tokens/s ratio and alpha, one run.

    python tools/bench_speculative.py --target default --draft default-draft
    python tools/bench_speculative.py --tiny          # random tiny pair, seconds (CI)

Both decoders run on the same prompts in the same process, each warmed up (compiled)
before it is timed, alternating repeats so machine noise hits both alike. Prints a table
and writes JSON (`--json`): per configuration, plain and speculative tokens/s, their ratio,
acceptance rate alpha, tokens per round and per-position acceptance. Greedy outputs are
checked to be identical (the benchmark refuses to report a lossy speedup).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np

import jaxspec


def _prompts(model: jaxspec.Model, n: int, length: int, seed: int) -> list[list[int]]:
    """Held-out-style prompts: tokenized Python source when the model has a tokenizer."""
    rng = np.random.RandomState(seed)
    if model.tokenizer is None:
        return [rng.randint(0, model.config.vocab_size, length).tolist() for _ in range(n)]
    import inspect
    import json as json_mod

    text = inspect.getsource(json_mod)  # the stdlib ships with every Python
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    starts = rng.randint(0, max(1, len(ids) - length), n)
    return [ids[s : s + length] for s in starts]


def _time(fn, repeats: int) -> tuple[float, Any]:
    fn()  # compile
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


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
    prompts = _prompts(target, batch, prompt_len, seed)
    rows = []
    for temp in temperatures:

        def plain(temp=temp):
            return jaxspec.generate(
                target, prompts, new_tokens, temperature=temp, seed=seed, stop_tokens=()
            )

        t_plain, out_plain = _time(plain, repeats)
        for gamma in gammas:
            for mode in ("sync", "pipelined"):

                def spec(temp=temp, gamma=gamma, mode=mode):
                    return jaxspec.generate(
                        target, prompts, new_tokens, temperature=temp, seed=seed, stop_tokens=(),
                        draft=draft, gamma=gamma, mode=mode,
                    )  # fmt: skip

                t_spec, out_spec = _time(spec, repeats)
                if temp == 0.0 and out_spec.tokens != out_plain.tokens:
                    raise SystemExit(f"greedy outputs differ at gamma={gamma} {mode}: not lossless")
                n_plain, n_spec = out_plain.stats.new_tokens, out_spec.stats.new_tokens
                s = out_spec.stats
                rows.append(
                    {
                        "temperature": temp,
                        "gamma": gamma,
                        "mode": mode,
                        "batch": batch,
                        "plain_tok_s": n_plain / t_plain,
                        "spec_tok_s": n_spec / t_spec,
                        "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                        "alpha": s.acceptance_rate,
                        "tokens_per_round": s.tokens_per_round,
                        "per_position_acceptance": list(s.per_position_acceptance),
                    }
                )
    return rows


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
