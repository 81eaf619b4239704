"""The `target` section (real pair, run only when named: `jaxspec bench --pairs real
--sections target`): plain greedy decoding of the real target, jaxspec vs transformers, and
jaxspec's time per token against the weight-read roofline, all measured in one run.

Batch 1, chat prompts, `target_new_tokens` tokens each with no stop token (both sides decode
the same count). Time per token is the decode loop's alone (`cost.loop_s_per_token`: (t(N) -
t(8)) / (N - 8) with t the best of `target_repeats` timed runs after a warm-up), so prefill and
compilation are not in it. The roofline is the weights' bytes divided by the read bandwidth
measured in the same run (a jitted sum over `roofline_mib` MiB): each decode step reads every
weight once. Greedy tokens of jaxspec float32 and transformers float32 must be identical (the
command fails otherwise).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

import jaxspec
from jaxspec_apps.bench.common import measure_roofline
from jaxspec_apps.bench.cost import SHORT, loop_s_per_token, plain_greedy
from jaxspec_apps.bench.peer import checkpoint_dir, load_hf
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (plain greedy, jaxspec vs transformers).
Config = sizes("target_", new_tokens=128, repeats=3, prompts=4)


QUICK_SIZES = Config(new_tokens=16, repeats=1, prompts=1)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=10)

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a Python list comprehension is.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
]


def _theirs(hf: Any, ids: tuple[int, ...], n: int) -> list[int]:
    """transformers' greedy decoding of `ids` to `n` new tokens."""
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def _prompt_row(
    text: str, ids: tuple[int, ...], decoders: dict[str, Callable[[int], Any]], new: int,
    repeats: int, mismatches: list[str],
) -> dict[str, Any]:  # fmt: skip
    """One prompt: are the greedy tokens identical, and each decoder's loop time per token."""
    ours = list(decoders["jaxspec_f32_s"](new).tokens)
    theirs = decoders["transformers_f32_s"](new)
    same = ours == theirs
    if not same:
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        mismatches.append(f"{text!r}: first differing token at {first}")
    row = {"prompt": text, "prompt_tokens": len(ids), "identical_greedy_tokens": same}
    for key, decode in decoders.items():
        row[key] = loop_s_per_token(decode, new, repeats)
    return row


def run(
    checkpoint: str, new_tokens: int, repeats: int, n_prompts: int, roofline_mib: int,
    command: str,
) -> dict[str, Any]:  # fmt: skip
    """Every prompt's row and the means against the roofline."""
    import torch

    if new_tokens <= SHORT:
        raise ValueError(f"target_new_tokens must be > {SHORT}")
    torch.set_num_threads(os.cpu_count() or 1)
    roof = measure_roofline(roofline_mib, 256)
    f32 = jaxspec.load(checkpoint)
    bf16 = jaxspec.load(checkpoint, dtype=jnp.bfloat16, tokenizer=False)
    hf = load_hf(checkpoint_dir(checkpoint))
    hf.generation_config.eos_token_id = None  # decode exactly N tokens, as jaxspec does
    texts = PROMPTS[:n_prompts]
    chat = f32.tokenizer is not None and getattr(f32.tokenizer, "chat_template", None)
    encode = jaxspec.chat_prompt if chat else jaxspec.encode_prompt
    rows, mismatches = [], []
    for text in texts:
        ids = encode(f32, text)
        decoders = {
            "jaxspec_f32_s": plain_greedy(f32, ids),
            "jaxspec_bf16_s": plain_greedy(bf16, ids),
            "transformers_f32_s": lambda n, ids=ids: _theirs(hf, ids, n),
        }
        rows.append(_prompt_row(text, ids, decoders, new_tokens, repeats, mismatches))
        print(json.dumps(rows[-1]), flush=True)
    out = {
        "command": command,
        "checkpoint": checkpoint,
        "params": f32.num_params(),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "chat": bool(chat),
        "bandwidth_Bps": roof["bandwidth_Bps"],
        "weight_bytes": {"float32": f32.nbytes(), "bfloat16": bf16.nbytes()},
        "rows": rows,
        "mismatches": mismatches,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1min": os.getloadavg()[0],
        },
    }
    return out | _figures(out)


def _figures(out: dict[str, Any]) -> dict[str, float]:
    """The means over the prompts: each decoder's tokens/s and fraction of its roofline."""
    rows, bw, res = out["rows"], out["bandwidth_Bps"], {}

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    for key, dtype in (("jaxspec_f32_s", "float32"), ("jaxspec_bf16_s", "bfloat16")):
        roof_s = out["weight_bytes"][dtype] / bw
        res[key.replace("_s", "_roofline_fraction")] = roof_s / mean(key)
        res[f"roofline_{dtype}_s"] = roof_s
    for key in ("jaxspec_f32_s", "jaxspec_bf16_s", "transformers_f32_s"):
        res[key.replace("_s", "_tok_per_s")] = 1.0 / mean(key)
    res["jaxspec_over_transformers_f32"] = mean("transformers_f32_s") / mean("jaxspec_f32_s")
    return res


def run_section(ctx: Context) -> dict[str, Any]:
    """`run` on the real pair's target at the profile's sizes."""
    p = ctx.p
    return run(
        ctx.target_name, p.target.new_tokens, p.target.repeats, p.target.prompts,
        p.roofline_mib, ctx.command,
    )  # fmt: skip


SECTION = Section("target", run_section, requires=("torch",), failures=lambda r: r["mismatches"])
