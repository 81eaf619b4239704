"""Plain greedy decoding of a real target, jaxspec vs transformers, and jaxspec's time per
token against the weight-read roofline, all measured in one run:

    python tools/bench_target.py                      # SmolLM2-135M-Instruct (fetched once)
    python tools/bench_target.py --out .              # also rewrite bench/target.* and the
                                                      # "Real target" section of BENCHMARKS.md

Batch 1, chat prompts, `--new-tokens` tokens each with no stop token (both sides decode the
same count). Time per token is the decode loop's alone: (t(N) - t(8)) / (N - 8) with t the best
of `--repeats` timed runs after a warm-up, so prefill and compilation are not in it. The
roofline is the weights' bytes divided by the read bandwidth measured in the same run (a jitted
sum over 256 MiB): each decode step reads every weight once. Greedy tokens of jaxspec float32
and transformers float32 must be identical (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any

import jax.numpy as jnp

import jaxspec
from jaxspec_apps.bench.peer import checkpoint_dir, load_hf
from jaxspec_apps.bench.report import write_tool_section
from jaxspec_apps.bench.verifier import measure_roofline

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a Python list comprehension is.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
]
SHORT = 8  # the run whose time is subtracted: prefill + the first SHORT tokens


def _best(fn: Any, repeats: int) -> float:
    fn()  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _ours(model: jaxspec.Model, ids: tuple[int, ...], n: int) -> list[int]:
    return list(jaxspec.generate(model, ids, n, temperature=0.0, stop_tokens=()).tokens)


def _theirs(hf: Any, ids: tuple[int, ...], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def per_token_s(decode: Any, ids: tuple[int, ...], n: int, repeats: int) -> float:
    long = _best(lambda: decode(ids, n), repeats)
    short = _best(lambda: decode(ids, SHORT), repeats)
    return (long - short) / (n - SHORT)


def run(
    checkpoint: str, new_tokens: int, repeats: int, n_prompts: int, roofline_mib: int
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    roof = measure_roofline(roofline_mib, 256)
    f32 = jaxspec.load(checkpoint)
    bf16 = jaxspec.load(checkpoint, dtype=jnp.bfloat16, tokenizer=False)
    hf = load_hf(checkpoint_dir(checkpoint))
    hf.generation_config.eos_token_id = None  # decode exactly N tokens, as jaxspec does
    texts = PROMPTS[:n_prompts]
    chat = f32.tokenizer is not None and getattr(f32.tokenizer, "chat_template", None)
    encode = jaxspec.chat_prompt if chat else jaxspec.encode_prompt
    prompts = [encode(f32, p) for p in texts]

    rows, mismatches = [], []
    for text, ids in zip(texts, prompts, strict=True):
        ours, theirs = _ours(f32, ids, new_tokens), _theirs(hf, ids, new_tokens)
        same = ours == theirs
        if not same:
            first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
            mismatches.append(f"{text!r}: first differing token at {first}")
        row = {
            "prompt": text,
            "prompt_tokens": len(ids),
            "identical_greedy_tokens": same,
            "jaxspec_f32_s": per_token_s(lambda i, n: _ours(f32, i, n), ids, new_tokens, repeats),
            "jaxspec_bf16_s": per_token_s(lambda i, n: _ours(bf16, i, n), ids, new_tokens, repeats),
            "transformers_f32_s": per_token_s(
                lambda i, n: _theirs(hf, i, n), ids, new_tokens, repeats
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    bw = roof["bandwidth_Bps"]
    out = {
        "command": "python tools/bench_target.py " + " ".join(sys.argv[1:]),
        "checkpoint": checkpoint,
        "params": f32.num_params(),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "chat": bool(chat),
        "bandwidth_Bps": bw,
        "weight_bytes": {"float32": f32.nbytes(), "bfloat16": bf16.nbytes()},
        "rows": rows,
        "mismatches": mismatches,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1min": os.getloadavg()[0],
        },
    }
    for key, dtype in (("jaxspec_f32_s", "float32"), ("jaxspec_bf16_s", "bfloat16")):
        roof_s = out["weight_bytes"][dtype] / bw
        out[key.replace("_s", "_roofline_fraction")] = roof_s / mean(key)
        out[f"roofline_{dtype}_s"] = roof_s
    for key in ("jaxspec_f32_s", "jaxspec_bf16_s", "transformers_f32_s"):
        out[key.replace("_s", "_tok_per_s")] = 1.0 / mean(key)
    out["jaxspec_over_transformers_f32"] = mean("transformers_f32_s") / mean("jaxspec_f32_s")
    return out


def markdown(r: dict[str, Any]) -> str:
    gb = r["bandwidth_Bps"] / 1e9
    lines = [
        f"## Real target: {r['checkpoint']}, plain greedy decoding",
        "",
        f"Produced by `{r['command']}` on {r['machine']['cpus']} CPUs (load average "
        f"{r['machine']['load_average_1min']:.1f} at the end). `{r['checkpoint']}`: "
        f"{r['params']:,} parameters, float32 or bfloat16 as loaded. Batch 1, "
        f"{len(r['rows'])} {'chat' if r['chat'] else 'plain'} prompts, "
        f"{r['new_tokens']} new tokens each without a stop token; time per token is the "
        f"decode loop's alone (t(N) - t(8)) / (N - 8), best of {r['repeats']} after a "
        f"warm-up. Roofline: weight bytes ÷ {gb:.1f} GB/s read bandwidth "
        "measured in the same run (each step reads every weight once; the KV cache is not "
        "counted). Greedy tokens of jaxspec and transformers (float32 both): "
        + ("**identical** on every prompt." if not r["mismatches"] else "**DIFFER**: ")
        + "; ".join(r["mismatches"]),
        "",
        "| decoder | weights | ms/token | tok/s | roofline ms | fraction of roofline |",
        "|---|---|---|---|---|---|",
    ]
    for name, key, dtype in (
        ("jaxspec", "jaxspec_f32", "float32"),
        ("jaxspec", "jaxspec_bf16", "bfloat16"),
        ("transformers", "transformers_f32", "float32"),
    ):
        tps = r[f"{key}_tok_per_s"]
        roof = r.get(f"roofline_{dtype}_s", 0.0)
        frac = f"{roof * tps:.2f}"
        lines.append(
            f"| {name} | {dtype} | {1000 / tps:.1f} | {tps:.1f} | {roof * 1000:.1f} | {frac} |"
        )
    lines += [
        "",
        "jaxspec ÷ transformers (float32 tokens/s): "
        f"**{r['jaxspec_over_transformers_f32']:.2f}×**.",
        "",
        "| prompt | prompt tokens | identical | jaxspec f32 ms | jaxspec bf16 ms | "
        "transformers ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['prompt']} | {row['prompt_tokens']} | {row['identical_greedy_tokens']} | "
            f"{row['jaxspec_f32_s'] * 1000:.1f} | {row['jaxspec_bf16_s'] * 1000:.1f} | "
            f"{row['transformers_f32_s'] * 1000:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="smollm2")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the prompts")
    p.add_argument("--roofline-mib", type=int, default=256, help="array read for the bandwidth")
    p.add_argument("--out", default=None, help="directory holding BENCHMARKS.md and bench/")
    args = p.parse_args(argv)
    if args.new_tokens <= SHORT:
        p.error(f"--new-tokens must be > {SHORT}")
    r = run(args.checkpoint, args.new_tokens, args.repeats, args.prompts, args.roofline_mib)
    md = markdown(r)
    print(md)
    if args.out is not None:
        bench = write_tool_section(pathlib.Path(args.out), "target", r, md)
        print(f"wrote {bench / 'target.json'}, target.md and BENCHMARKS.md's section")
    return 1 if r["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
