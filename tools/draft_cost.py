"""What a draft for SmolLM2 may cost: time per greedy token in this project's own decode loop
(`jaxspec.generate`, batch 1, compilation excluded) of candidate draft shapes, divided by the
target's, in one run:

    python tools/draft_cost.py                  # SmolLM2-135M-Instruct (fetched by name)
    python tools/draft_cost.py --target default --layers 1,2 --widths 64   # quick check

Candidates, each in float32, at W4A16 (`jaxspec.quantize`, AQT int4) and at W4A16 with the
embedding/head table kept in bfloat16 (`embeddings=False`):
- `first K layers`: the target's embedding, its first K decoder layers and final norm (tied
  head): the width stays 576, so the vocabulary projection (49152 x 576) stays whole;
- `width W, K layers`: a narrower model with the target's vocabulary (random weights: only
  its shape matters for speed), whose projection costs W/576 of the target's.
A draft pays when its cost ratio is well under 1/(1 + gamma) (the issue asks <= 1/5).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jaxspec
from jaxspec.nn.model import Model, init_params


def first_layers(model: Model, k: int) -> Model:
    """The target cut to its first `k` decoder layers (embedding, norm and head kept)."""
    p = model.params
    params = {n: v for n, v in p.items() if not n.startswith("layers_") or int(n[7:]) < k}
    cfg = dataclasses.replace(model.config, num_hidden_layers=k)
    return dataclasses.replace(model, config=cfg, params=params, name=f"first {k} layers")


def narrow(model: Model, width: int, k: int) -> Model:
    """A random model of the target's vocabulary, `width` wide and `k` layers deep."""
    c = model.config
    heads = max(1, width // 64)
    cfg = dataclasses.replace(
        c, hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64 or 64,
        num_hidden_layers=k, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 3) if heads % 3 == 0 else heads, head_dim=64,
    )  # fmt: skip
    return dataclasses.replace(
        model, config=cfg, params=init_params(cfg, seed=0), name=f"width {width}, {k} layers"
    )


def seconds_per_token(model: Model, prompt: list[int], new: int, repeats: int) -> float:
    jaxspec.generate(model, prompt, new, temperature=0.0)  # compile
    best = min(
        jaxspec.generate(model, prompt, new, temperature=0.0).stats.wall_s for _ in range(repeats)
    )
    return best / new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--layers", default="1,2,4", help="K for the candidates")
    p.add_argument("--widths", default="192,256,384", help="W for the narrow candidates")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    target = jaxspec.load(args.target)
    prompt = list(range(1, 17))
    layers = [int(x) for x in args.layers.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    t_target = seconds_per_token(target, prompt, args.new_tokens, args.repeats)
    print(f"target {args.target}: {t_target * 1e3:.2f} ms/token (float32)")
    print("| candidate | params (M) | float32 | W4A16 | W4A16 MB | W4A16, bf16 table | MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    candidates = [first_layers(target, k) for k in layers]
    candidates += [narrow(target, w, k) for w in widths for k in layers]
    for m in candidates:
        f32 = seconds_per_token(m, prompt, args.new_tokens, args.repeats) / t_target
        q = jaxspec.quantize(m, "w4a16", 64, method="rtn")
        w4 = seconds_per_token(q, prompt, args.new_tokens, args.repeats) / t_target
        qe = jaxspec.quantize(m, "w4a16", 64, method="rtn", embeddings=False)
        w4e = seconds_per_token(qe, prompt, args.new_tokens, args.repeats) / t_target
        print(
            f"| {m.name} | {m.num_params() / 1e6:.1f} | {f32:.3f} | {w4:.3f} | "
            f"{q.nbytes() / 2**20:.1f} | {w4e:.3f} | {qe.nbytes() / 2**20:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
