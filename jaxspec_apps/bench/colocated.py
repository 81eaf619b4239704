"""Co-located speculative vs plain decoding: tokens/s ratio, alpha and tokens per round.

Both decoders run on the same prompts in one process, each warmed up (compiled) before it
is timed; greedy outputs must be identical (the benchmark refuses to report a lossy speedup).
The tiny pair's section (`TINY`) sweeps temperature, gamma and mode with the draft and with
self-speculation (the target at W4A16); the real pair's (`REAL`) runs one prompt per
Spec-Bench category at T = 0.7 (Spec-Bench's T = 0 table is `specbench`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jaxspec
from jaxspec.figures import AcceptanceFigures
from jaxspec_apps.bench.common import best_time, check_same_tokens
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (batch 1, one prompt at a time; `new_tokens` and `prompts` are also the
# real pair's `cost` and `llamacpp` sizes): self_modes: self-speculation: gamma only.
Config = sizes(
    "",
    prompts=4,
    new_tokens=128,
    gammas=(2, 4, 6),
    modes=("sync", "pipelined"),
    temperatures=(0.0, 1.0),
    self_modes=("sync", "pipelined"),
)


QUICK_SIZES = Config(prompts=1, new_tokens=16, gammas=(4,), modes=("sync",), self_modes=("sync",))
TINY_SIZES = dataclasses.replace(QUICK_SIZES, temperatures=(0.0,), new_tokens=8)
REAL_SIZES = Config(prompts=5, gammas=(4,), modes=("sync",), self_modes=())


def _timed_generate(
    target: Any,
    prompts: Sequence[Sequence[int]],
    batch: int,
    new_tokens: int,
    repeats: int,
    **kw: Any,
) -> tuple[float, int, list[list[int]], list[Any]]:
    """(seconds, new tokens, token lists, stats) of `generate` over `prompts` in chunks of
    `batch` rows; each chunk's time is the best of `repeats` after a warm-up."""

    seconds, tokens, outs, stats = 0.0, 0, [], []
    for lo in range(0, len(prompts), batch):
        chunk = [list(p) for p in prompts[lo : lo + batch]]
        t, out = best_time(lambda c=chunk: jaxspec.generate(target, c, new_tokens, **kw), repeats)
        seconds += t
        tokens += out.stats.new_tokens
        outs += out.tokens
        stats.append(out.stats)
    return seconds, tokens, outs, stats


def pooled(stats: list[Any]) -> dict[str, Any]:
    """Alpha, tokens per round and per-position acceptance over several `generate` calls:
    their `AcceptanceFigures` summed, read as docs/design.md §7 defines them."""
    figures = sum((s.figures for s in stats), AcceptanceFigures())
    return {
        "alpha": figures.acceptance_rate,
        "tokens_per_round": figures.tokens_per_round,
        "per_position_acceptance": list(figures.per_position_acceptance),
    }


def run(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    *,
    gammas: Sequence[int],
    temperatures: Sequence[float],
    new_tokens: int,
    repeats: int,
    modes: Sequence[str] = ("sync", "pipelined"),
    batch: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (temperature, gamma, mode): plain and speculative tokens/s, their ratio,
    alpha (accepted / drafted) and tokens per round, over all `prompts`."""
    rows = []
    common = dict(seed=seed, stop_tokens=())
    for temp in temperatures:
        t_plain, n_plain, plain_out, _ = _timed_generate(
            target, prompts, batch, new_tokens, repeats, temperature=temp, **common
        )
        for gamma in gammas:
            for mode in modes:
                t_spec, n_spec, spec_out, stats = _timed_generate(
                    target, prompts, batch, new_tokens, repeats, temperature=temp,
                    draft=draft, gamma=gamma, mode=mode, **common,
                )  # fmt: skip
                if temp == 0.0:
                    for i, (got, want) in enumerate(zip(spec_out, plain_out, strict=True)):
                        check_same_tokens(
                            f"speculative gamma={gamma} {mode}, prompt {i}", got, want
                        )
                rows.append(
                    {
                        "temperature": temp,
                        "gamma": gamma,
                        "mode": mode,
                        "batch": batch,
                        "prompts": len(prompts),
                        "plain_tok_s": n_plain / t_plain,
                        "spec_tok_s": n_spec / t_spec,
                        "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                        "gammas": [s.gamma for s in stats],  # what gamma="auto" picked
                        **pooled([s for s in stats if s.figures is not None]),
                    }
                )
    return rows


def run_tiny(ctx: Context) -> dict[str, Any]:
    """The tiny pair's sweep, with its draft and with self-speculation (the target at W4A16,
    group 128, no calibration)."""
    p, prompts = ctx.p, ctx.prompts[: ctx.p.colocated.prompts]
    kw = dict(
        temperatures=p.colocated.temperatures, new_tokens=p.colocated.new_tokens, repeats=p.repeats
    )
    pair = run(
        ctx.target, ctx.draft, prompts, gammas=p.colocated.gammas, modes=p.colocated.modes, **kw
    )
    self_draft = jaxspec.quantize(ctx.target, "w4a16", 128, method="asym")
    self_rows = run(
        ctx.target, self_draft, prompts, gammas=(p.gamma,), modes=p.colocated.self_modes, **kw
    )
    return {"default_pair": pair, "self_w4a16": self_rows, "self_draft_bytes": self_draft.nbytes()}


def run_real(ctx: Context) -> dict[str, Any]:
    """The real pair at T = 0.7, one prompt per category."""
    p = ctx.p
    rows = run(
        ctx.target, ctx.draft, ctx.prompts, gammas=(p.gamma, "auto"), temperatures=(0.7,),
        new_tokens=p.colocated.new_tokens, repeats=p.repeats, modes=p.colocated.modes,
    )  # fmt: skip
    return {"rows": rows, "prompts": len(ctx.prompts)}


TINY = Section("colocated", run_tiny)
REAL = Section("colocated", run_real)
