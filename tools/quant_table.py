#!/usr/bin/env python
"""W4A16 methods on a real model, measured: method x group size x (resident bytes, held-out
perplexity ratio, greedy agreement, alpha at T=0 / 0.7 as a draft for the float model,
quantization time).

Held out: the chat prompts come from `jaxspec.quant.calibration.chat_prompts(..., heldout=True)`,
sources (help topics, modules) the calibration never uses; the float model answers them
greedily and each variant is scored teacher-forced on those answers (agreement: its argmax
equals the float model's) and on held-out help-topic text (perplexity ratio). alpha is vLLM's
acceptance rate (accepted / drafted) of `jaxspec.generate(float, prompts, draft=variant,
gamma=4)`, with the greedy-token equality of speculative and plain decoding asserted at T=0.

    python tools/quant_table.py --out .        # SmolLM2 (~25 min, 2 cores): BENCHMARKS.md
    python tools/quant_table.py --checkpoint default --prompts 4 --alpha-prompts 2 \\
        --new-tokens 8 --variants asym:32,gptq:32 --out /tmp/q   # a quick run
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shlex
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import jaxspec  # noqa: E402
from jaxspec.quant import calibration  # noqa: E402

DEFAULT_VARIANTS = (
    "rtn:128,asym:128,clip:128,gptq:128,gptq:128:8,clip:128:8,gptq:64,gptq:32,asym:32"
)


def parse_variant(text: str) -> tuple[str, int, int | None]:
    method, group, *head = text.split(":")
    return method, int(group), int(head[0]) if head else None


def label(v: tuple[str, int, int | None]) -> str:
    method, group, head = v
    return f"{method} g{group}" + ("" if head is None else f", head int{head}")


def padded(seqs: list[list[int]], starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """tokens [N, L] (L a multiple of 64) and the mask of positions whose next token scores."""
    L = -(-max(map(len, seqs)) // 64) * 64
    toks = np.zeros((len(seqs), L), np.int32)
    mask = np.zeros((len(seqs), L), bool)
    for i, (s, a) in enumerate(zip(seqs, starts, strict=True)):
        toks[i, : len(s)] = s
        mask[i, a - 1 : len(s) - 1] = True
    return toks, mask


def scores(model: jaxspec.Model, toks: np.ndarray, batch: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(argmax [N, L], log p of the next token [N, L]) teacher-forced."""
    nxt = np.zeros_like(toks)
    nxt[:, :-1] = toks[:, 1:]

    @jax.jit
    def one(params, t, n):
        B, T = t.shape
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        lg, _ = model.module.apply({"params": params}, t, pos, t > -1, model.init_cache(B, T))
        lp = jax.nn.log_softmax(lg, -1)
        return jnp.argmax(lg, -1), jnp.take_along_axis(lp, n[..., None], -1)[..., 0]

    out = [
        one(model.params, toks[i : i + batch], nxt[i : i + batch])
        for i in range(0, len(toks), batch)
    ]
    return np.concatenate([np.asarray(a) for a, _ in out]), np.concatenate(
        [np.asarray(b) for _, b in out]
    )


def heldout_text(model: jaxspec.Model, windows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of held-out help-topic text (sources the calibration never sees)."""
    from pydoc_data.topics import topics

    ids: list[int] = []
    for name in sorted(topics):
        if calibration.is_heldout(f"pydoc/{name}"):
            ids += model.tokenizer.encode(topics[name], add_special_tokens=False)
    wins = [ids[i * length : (i + 1) * length] for i in range(windows)]
    return padded(wins, [1] * len(wins))


def alpha(target: Any, draft: Any, prompts: list[list[int]], new: int, t: float) -> float:
    out = jaxspec.generate(target, prompts, new, draft=draft, gamma=4, temperature=t, seed=1)
    if t == 0.0:
        plain = jaxspec.generate(target, prompts, new, temperature=0.0)
        assert out.tokens == plain.tokens, "speculative greedy tokens differ from plain greedy"
    return float(out.stats.figures.acceptance_rate)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="smollm2", help="the float model (default: smollm2)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="method:group[:head_bits],...")
    p.add_argument("--prompts", type=int, default=24, help="held-out chat prompts scored")
    p.add_argument("--alpha-prompts", type=int, default=8, help="prompts for alpha (one batch)")
    p.add_argument("--answer-tokens", type=int, default=96, help="float answer length scored")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per alpha run")
    p.add_argument("--text-windows", type=int, default=8, help="held-out text windows (ppl)")
    p.add_argument(
        "--out", type=pathlib.Path, required=True,
        help="a report directory: bench/quant.json, bench/quant.md, its BENCHMARKS.md section",
    )  # fmt: skip
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    target = jaxspec.load(args.checkpoint)
    bf16 = 2 * target.num_params()
    held = [list(calibration.prompt_ids(target, t)) for _, t in
            calibration.chat_prompts(args.prompts, seed=1, heldout=True)]  # fmt: skip
    answers = jaxspec.generate(target, held, args.answer_tokens, temperature=0.0).tokens
    toks, mask = padded(
        [h + list(a) for h, a in zip(held, answers, strict=True)], [len(h) for h in held]
    )
    f_arg, _ = scores(target, toks)
    ttoks, tmask = heldout_text(target, args.text_windows, 256)
    _, f_lp = scores(target, ttoks)
    f_nll = -f_lp[tmask].mean()
    print(f"float model scored ({time.perf_counter() - t0:.0f} s)", flush=True)

    t1 = time.perf_counter()
    seqs = calibration.default_sequences(target)
    t_answers = time.perf_counter() - t1
    hess = calibration.hessians(target, seqs)
    t_calib = time.perf_counter() - t1
    print(f"calibration: answers {t_answers:.0f} s, with Hessians {t_calib:.0f} s", flush=True)

    rows = []
    prompts = held[: args.alpha_prompts]
    for v in map(parse_variant, args.variants.split(",")):
        method, group, head = v
        t2 = time.perf_counter()
        if method == "gptq":  # the Hessians above, shared by every GPTQ row
            q = _gptq(target, group, head, hess)
        else:
            q = jaxspec.quantize(target, "w4a16", group, method=method, head_bits=head)
        t_q = time.perf_counter() - t2 + (t_calib if method == "gptq" else 0.0)
        q_arg, _ = scores(q, toks)
        _, q_lp = scores(q, ttoks)
        row = {
            "variant": label(v), "method": method, "group": group, "head_bits": head,
            "bytes_vs_bf16": q.nbytes() / bf16,
            "ppl_ratio": float(np.exp(-q_lp[tmask].mean() - f_nll)),
            "agreement": float((q_arg == f_arg)[mask].mean()),
            "alpha_t0": alpha(target, q, prompts, args.new_tokens, 0.0),
            "alpha_t07": alpha(target, q, prompts, args.new_tokens, 0.7),
            "quantize_s": t_q,
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    write(args, rows, {"answers_s": t_answers, "calibration_s": t_calib})
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


def _gptq(target: Any, group: int, head: int | None, hess: dict) -> Any:
    """`jaxspec.quantize(method="gptq")` on Hessians already taken (the same numbers as letting
    it calibrate: `default_sequences` and `hessians` are deterministic)."""
    import importlib

    qmod = importlib.import_module("jaxspec.quant.quantize")
    calib = importlib.import_module("jaxspec.quant.calibration")
    keep = calib.hessians
    calib.hessians = lambda *a, **k: hess
    try:
        return qmod.quantize(
            target, "w4a16", group, method="gptq", head_bits=head, calibration=[[0]]
        )
    finally:
        calib.hessians = keep


def markdown(rows: list[dict], calib: dict, cmd: str, checkpoint: str) -> str:
    """The BENCHMARKS.md section: the table and how it was measured."""
    lines = [
        f"## W4A16 methods on `{checkpoint}`",
        "",
        f"Produced by `{cmd}`. Held-out chat prompts (sources the calibration never uses), "
        "the float model's greedy answers scored teacher-forced (agreement: the copy's argmax "
        "equals the float model's), perplexity ratio on held-out help-topic text, alpha = "
        "accepted ÷ drafted of co-located decoding with the float model verifying (γ = 4; "
        "greedy tokens asserted equal to plain decoding at T = 0). Time: quantization, plus "
        f"for GPTQ its calibration ({calib['answers_s']:.0f} s of answers, "
        f"{calib['calibration_s']:.0f} s with the Hessians).",
        "",
        "| method | bytes / bf16 | ppl ratio | agreement | alpha T=0 | alpha T=0.7 | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['bytes_vs_bf16']:.3f} | {r['ppl_ratio']:.3f} | "
            f"{r['agreement']:.3f} | {r['alpha_t0']:.3f} | {r['alpha_t07']:.3f} | "
            f"{r['quantize_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write(args: argparse.Namespace, rows: list[dict], calib: dict) -> None:
    """bench/quant.json and .md under `--out` and the section of its BENCHMARKS.md."""
    from jaxspec_apps.bench.render import write_kept

    cmd = "python " + " ".join(shlex.quote(a) for a in ["tools/quant_table.py", *sys.argv[1:]])
    record = {"command": cmd, "machine": platform.machine(), "rows": rows, **calib}
    write_kept(args.out, "quant", record, markdown(rows, calib, cmd, args.checkpoint))


if __name__ == "__main__":
    sys.exit(main())
