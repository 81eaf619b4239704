"""Quantized drafts against the float ones: held-out perplexity, alpha, resident bytes.

The metric functions are shared with `tools/quality_w4a16.py` (the full variant table);
`w4a16_summary` is the tiny pair's short form: the shipped draft at W4A16 (group 128)
against the same draft unquantized, on the documents held out of the pair's training;
`quality_rows` the real pair's: each draft (the W4A16 self-draft, the small distilled one)
next to the target.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.nn.model import Llama, init_cache
from jaxspec_apps.bench.common import SELF_DRAFT, SMALL_DRAFT, prompts_from
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (held-out windows for perplexity, prompts for alpha).
Config = sizes("quality_", windows=32, seq_len=256, prompts=8, new_tokens=48)


QUICK_SIZES = Config(windows=2, seq_len=64, prompts=2, new_tokens=8)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, prompts=1, seq_len=32)
REAL_SIZES = Config(windows=8, prompts=4)


def _logits(module: Llama, params: Any, batch_BT: jax.Array) -> jax.Array:
    """Log-probabilities `[B, T, V]` for the windows `[B, T+1]` (inputs: all but the last)."""
    x = batch_BT[:, :-1]
    B, T = x.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
    cache = init_cache(module.config, B, T, module.dtype)
    logits, _ = module.apply({"params": params}, x, pos, jnp.ones((B, T), bool), cache)
    return jax.nn.log_softmax(logits, axis=-1)


target_logp = jax.jit(_logits, static_argnames=("module",))


@functools.partial(jax.jit, static_argnames=("module",))
def _window_stats(
    module: Llama, params: Any, batch_BT: jax.Array, t_logp_BTV: jax.Array
) -> dict[str, jax.Array]:
    """Per window: summed NLL, greedy agreement with the target and sum_x min(p, q) (the
    expected acceptance of a temperature-1 draft, teacher-forced)."""
    logp = _logits(module, params, batch_BT)
    y = batch_BT[:, 1:]
    nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
    agree = jnp.argmax(logp, -1) == jnp.argmax(t_logp_BTV, -1)
    accept = jnp.sum(jnp.minimum(jnp.exp(logp), jnp.exp(t_logp_BTV)), axis=-1)
    return {"nll": nll.sum(1), "agree": agree.sum(1), "accept": accept.sum(1)}


def batches(windows: dict[str, np.ndarray], batch: int) -> list[tuple[str, np.ndarray, int]]:
    """(kind, zero-padded batch `[batch, T+1]`, real rows) over every held-out window."""
    out = []
    for kind, win in windows.items():
        for i in range(0, len(win), batch):
            chunk = win[i : i + batch]
            pad = np.zeros((batch - len(chunk), win.shape[1]), np.int32)
            out.append((kind, np.concatenate([chunk, pad]), len(chunk)))
    return out


def heldout_metrics(
    model: jaxspec.Model, evals: list[tuple[str, np.ndarray, int, Any]]
) -> dict[str, float]:
    """Perplexity (per kind and all), teacher-forced greedy agreement and E[alpha] at T=1."""
    sums: dict[str, dict[str, float]] = {}
    for kind, batch, rows, t_logp in evals:
        res = _window_stats(model.module, model.params, batch, t_logp)
        s = sums.setdefault(kind, {"nll": 0.0, "agree": 0.0, "accept": 0.0, "n": 0})
        for k in ("nll", "agree", "accept"):
            s[k] += float(np.asarray(res[k])[:rows].sum())
        s["n"] += rows * (batch.shape[1] - 1)
    total = {k: sum(s[k] for s in sums.values()) for k in ("nll", "agree", "accept", "n")}
    out = {f"ppl_{kind}": math.exp(s["nll"] / s["n"]) for kind, s in sums.items()}
    return out | {
        "ppl": math.exp(total["nll"] / total["n"]),
        "greedy_agreement": total["agree"] / total["n"],
        "expected_alpha_t1": total["accept"] / total["n"],
        "positions": total["n"],
    }


def acceptance(
    target: jaxspec.Model,
    draft: jaxspec.Model,
    prompts: list[list[int]],
    new_tokens: int,
    gamma: int,
    temperatures: tuple[float, ...] = (0.0, 1.0),
) -> dict[str, float]:
    """Measured alpha and tokens per round of co-located speculative decoding at each
    temperature (keys `alpha_t0`, `alpha_t0.7`, ...)."""
    out = {}
    for temp in temperatures:
        res = jaxspec.generate(
            target, prompts, new_tokens, draft=draft, gamma=gamma, temperature=temp,
            seed=0, stop_tokens=[],
        )  # fmt: skip
        key = f"t{temp:g}"
        out[f"alpha_{key}"] = res.stats.figures.acceptance_rate
        out[f"tokens_per_round_{key}"] = res.stats.figures.tokens_per_round
    return out


def spread_windows(stream: np.ndarray, length: int, n: int) -> np.ndarray:
    """`n` windows `[n, length]` at evenly spaced offsets of `stream` (all of it is sampled)."""
    n = max(1, min(n, len(stream) // length))
    starts = np.linspace(0, len(stream) - length, n).astype(int)
    return np.stack([stream[s : s + length] for s in starts]).astype(np.int32)


def w4a16_summary(
    target: jaxspec.Model,
    draft: jaxspec.Model,
    stream: np.ndarray,
    prompts: Sequence[Sequence[int]],
    *,
    windows: int,
    seq_len: int,
    new_tokens: int,
    gamma: int,
    group_size: int = 128,
) -> dict[str, Any]:
    """The draft as loaded and at W4A16: bytes, held-out perplexity, agreement, alpha; and
    the ratios W4A16 / unquantized (bytes against bf16, the paper's baseline precision)."""
    win = {"heldout": spread_windows(stream, seq_len + 1, windows)}
    evals = [
        (kind, b, rows, target_logp(target.module, target.params, b))
        for kind, b, rows in batches(win, min(8, windows))
    ]
    rows = {}
    for label, model in (
        ("float", draft),
        (f"w4a16 g{group_size}", jaxspec.quantize(draft, "w4a16", group_size, method="rtn")),
    ):
        rows[label] = {
            "resident_bytes": model.nbytes(),
            "bytes_vs_bf16": model.nbytes() / (2 * draft.num_params()),
            **heldout_metrics(model, evals),
            **acceptance(target, model, [list(p) for p in prompts], new_tokens, gamma),
        }
    f, q = rows["float"], rows[f"w4a16 g{group_size}"]
    return {
        "rows": rows,
        "windows": len(win["heldout"]),
        "seq_len": seq_len,
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "w4a16_bytes_ratio": q["bytes_vs_bf16"],
        "w4a16_ppl_ratio": q["ppl"] / f["ppl"],
        "w4a16_alpha_ratio": q["alpha_t1"] / f["alpha_t1"],
        "w4a16_alpha_ratio_t0": q["alpha_t0"] / f["alpha_t0"],
    }


def quality_rows(
    target: Any,
    drafts: dict[str, Any],
    stream: np.ndarray,
    prompts: list[list[int]],
    p: Any,
) -> dict[str, Any]:
    """The quality table on this model: each draft (the W4A16 self-draft, the small distilled
    one) with held-out perplexity, agreement and alpha at T = 0 and 0.7."""
    win = {"heldout": spread_windows(stream, p.quality.seq_len + 1, p.quality.windows)}
    evals = [
        (kind, b, rows, target_logp(target.module, target.params, b))
        for kind, b, rows in batches(win, min(4, p.quality.windows))
    ]
    rows = {}
    for label, model in {"target (no draft: the reference)": target, **drafts}.items():
        row = {
            "params": model.num_params(),
            "resident_bytes": model.nbytes(),
            "bytes_vs_target_bf16": model.nbytes() / (2 * target.num_params()),
            **heldout_metrics(model, evals),
        }
        if model is not target:
            row |= acceptance(
                target, model, prompts, p.quality.new_tokens, p.gamma, temperatures=(0.0, 0.7)
            )
        rows[label] = row
    return {
        "rows": rows,
        "windows": len(win["heldout"]),
        "seq_len": p.quality.seq_len,
        "prompts": len(prompts),
        "new_tokens": p.quality.new_tokens,
        "gamma": p.gamma,
    }


def run_tiny(ctx: Context) -> dict[str, Any]:
    """The shipped draft at W4A16 against itself unquantized."""
    p = ctx.p
    return w4a16_summary(
        ctx.target, ctx.draft, ctx.stream,
        prompts_from(ctx.stream, p.quality.prompts, p.prompt_len, seed=2),
        windows=p.quality.windows, seq_len=p.quality.seq_len,
        new_tokens=p.quality.new_tokens, gamma=p.gamma,
    )  # fmt: skip


def run_real(ctx: Context) -> dict[str, Any]:
    """The pair's draft, and beside the default one the small distilled draft."""
    p = ctx.p
    qp = prompts_from(ctx.stream, p.quality.prompts, p.prompt_len, seed=2)
    drafts = {f"draft `{ctx.draft_name}`": ctx.draft}
    if ctx.draft_name == SELF_DRAFT:  # the pair's default: the small draft beside it
        drafts[f"small draft `{SMALL_DRAFT}`"] = jaxspec.load(SMALL_DRAFT)
    return quality_rows(ctx.target, drafts, ctx.stream, qp, p)


TINY = Section("quality", run_tiny)
REAL = Section("quality", run_real)
