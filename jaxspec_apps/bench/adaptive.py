"""Adaptive gamma against every fixed gamma, over round trips and draft pairs.

Every point is pipelined edge-cloud decoding, batch 1, through an in-process verifier
(`verify.LocalVerifier` over one warmed-up scheduler) behind a simulated link
(`edge.DelayedEndpoint`, RTT/2 each way): the same prompts with each fixed gamma in
1..longest (the longest block) and with `gamma="auto"` (`edge.adaptive.AdaptiveGamma`), at the
same pipeline depth. Time per token is the session's wall time over its tokens (the first round trip
included: the adaptive controller starts knowing nothing). The auto run's tokens must equal
every fixed run's token for token (position-keyed draws; pipelined mode has no bonus):
a difference is recorded as a failure.

The section (`SECTION`, run only when named: `jaxspec bench --pairs tiny --sections
adaptive`) sweeps two drafts of the tiny pair's target: `self` drafts with the target itself
at W4A16 (each draft as costly as a target step, high acceptance), `draft` with the shipped
draft at W4A16 (a fraction of the cost); the table's alpha is each point's acceptance rate
over its timed sessions (their `AcceptanceFigures` summed; the untimed warm-ups excluded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import jaxspec
from edge.adaptive import AdaptiveGamma
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.common import make_scheduler, prompts_from
from jaxspec_apps.bench.section import Context, Section, sizes
from verify import LocalVerifier

# This section's sizes (gamma="auto" against every fixed gamma up to `longest`): drafts: which
# pairs (`DRAFTS`).
Config = sizes(
    "adaptive_",
    rtts_ms=(0.0, 20.0, 50.0, 100.0, 200.0),
    longest=8,
    prompts=2,
    new_tokens=48,
    drafts=("self", "draft"),
)


QUICK_SIZES = Config(rtts_ms=(0.0, 50.0), longest=4, prompts=1, new_tokens=16)
TINY_SIZES = dataclasses.replace(
    QUICK_SIZES, rtts_ms=(0.0, 20.0), longest=2, new_tokens=8, drafts=("self",)
)

DRAFTS = {"self": "self (target at W4A16)", "draft": "shipped draft at W4A16"}


async def _session(
    sched: Any,
    draft: Any,
    prompt: Sequence[int],
    gamma: int | str,
    longest: int,
    depth: int,
    rtt_s: float,
    new_tokens: int,
) -> tuple[list[int], float, list[int], AcceptanceFigures]:
    """(tokens, seconds per token, block lengths used, the verifier's acceptance figures) of
    one greedy pipelined session."""
    auto = gamma == "auto"
    spec = DraftSpec(gamma=longest if auto else int(gamma), encoding="onehot", adaptive=auto)
    cfg = SessionConfig(
        prompt=tuple(prompt), max_new_tokens=new_tokens, mode="pipelined", draft=spec,
        sampling=SamplingSettings(temperature=0.0),
    )  # fmt: skip
    policy = AdaptiveGamma(longest, "pipelined", depth) if auto else None
    v = LocalVerifier(scheduler=sched)
    try:
        tr = await run_session(
            DelayedEndpoint(v, one_way_s=rtt_s / 2),
            Drafter(draft, spec),
            cfg,
            depth=depth,
            block_len=policy,
        )
    finally:
        await v.aclose()
    used = policy.chosen if policy is not None else [int(gamma)] * tr.blocks_sent
    return tr.tokens, (tr.end_time - tr.start_time) / max(1, len(tr.tokens)), used, tr.figures


def _point(
    sched: Any, draft: Any, prompts: Sequence[Sequence[int]], rtt_s: float, depth: int,
    longest: int, new_tokens: int,
) -> tuple[dict[str, float], list[int], AcceptanceFigures, list[str]]:  # fmt: skip
    """One (pair, RTT) point: the mean seconds per token of each fixed gamma and of auto,
    the block lengths auto chose, the timed sessions' acceptance figures summed, and which
    (prompt, gamma) gave other tokens than the first gamma did."""
    per: dict[str, float] = {}
    chosen: list[int] = []
    figures = AcceptanceFigures()
    differs: list[str] = []
    reference: dict[int, list[int]] = {}  # prompt -> tokens of the first gamma run
    for g in [*range(1, longest + 1), "auto"]:
        # One untimed session first: a block length's first session after other lengths
        # compiled again (measured: ~3 s here), which is not its speed; nor its figures.
        asyncio.run(_session(sched, draft, prompts[0], g, longest, depth, rtt_s, new_tokens))
        times = []
        for i, prompt in enumerate(prompts):
            toks, s, used, fig = asyncio.run(
                _session(sched, draft, prompt, g, longest, depth, rtt_s, new_tokens)
            )
            times.append(s)
            figures += fig
            if g == "auto":
                chosen += used
            if reference.setdefault(i, toks) != toks:
                differs.append(f"prompt {i}: gamma {g} differs")
        per[str(g)] = sum(times) / len(times)
    return per, chosen, figures, differs


def sweep(
    sched: Any,
    pairs: dict[str, Any],
    prompts: Sequence[Sequence[int]],
    *,
    rtts_ms: Sequence[float],
    longest: int,
    new_tokens: int,
    depth_for: Any = None,
) -> dict[str, Any]:
    """`{"rows": [...], "failures": [...]}`: one row per (pair, RTT) with the mean time per
    token of each fixed gamma and of auto, the best fixed gamma, auto's ratio to it, and
    alpha over the point's timed sessions."""
    depth_for = depth_for or (lambda rtt_s: max(2, min(4, math.ceil(rtt_s / 0.05) + 1)))
    rows, failures = [], []
    for pair, draft in pairs.items():
        for rtt_ms in rtts_ms:
            depth = depth_for(rtt_ms / 1e3)
            per, chosen, figures, differs = _point(
                sched, draft, prompts, rtt_ms / 1e3, depth, longest, new_tokens
            )
            failures += [f"{pair} rtt={rtt_ms} ms {d}" for d in differs]
            fixed = {g: t for g, t in per.items() if g != "auto"}
            best = min(fixed, key=fixed.__getitem__)
            rows.append(
                {
                    "pair": pair,
                    "rtt_ms": rtt_ms,
                    "depth": depth,
                    "token_s": per,
                    "best_fixed_gamma": int(best),
                    "auto_over_best": per["auto"] / fixed[best],
                    "auto_gammas": {str(k): chosen.count(k) for k in sorted(set(chosen))},
                    "alpha": figures.acceptance_rate,
                }
            )
            print(
                f"{pair} rtt {rtt_ms:5.0f} ms depth {depth}: best fixed gamma {best} "
                f"{fixed[best] * 1e3:.2f} ms/token, auto {per['auto'] * 1e3:.2f} "
                f"({per['auto'] / fixed[best]:.3f}x), auto chose {rows[-1]['auto_gammas']}",
                flush=True,
            )
    return {"rows": rows, "failures": failures, "summary": summary(rows, longest)}


def summary(rows: list[dict[str, Any]], longest: int) -> dict[str, Any]:
    """Over the whole sweep: total time per token (sum over points) of auto and of each
    fixed gamma, and auto's worst ratio to the best fixed gamma at any one point."""
    total = {str(g): sum(r["token_s"][str(g)] for r in rows) for g in [*range(1, longest + 1)]}
    auto = sum(r["token_s"]["auto"] for r in rows)
    best_single = min(total, key=total.__getitem__)
    return {
        "auto_total_s": auto,
        "fixed_total_s": total,
        "best_single_fixed_gamma": int(best_single),
        "auto_over_best_single": auto / total[best_single],
        "worst_point_ratio": max(r["auto_over_best"] for r in rows),
    }


def run_section(ctx: Context) -> dict[str, Any]:
    """The sweep over the profile's round trips for each draft in `adaptive_drafts`, on
    held-out prompts of the tiny pair's target."""
    p, target = ctx.p, ctx.target
    drafts = {"self": lambda: target, "draft": lambda: ctx.draft}
    pairs = {
        DRAFTS[name]: jaxspec.quantize(drafts[name](), "w4a16", 128, method="asym")
        for name in p.adaptive.drafts
    }
    prompts = prompts_from(ctx.stream, p.adaptive.prompts, p.prompt_len, seed=3)
    longest, new_tokens = p.adaptive.longest, p.adaptive.new_tokens
    max_len = max(map(len, prompts)) + new_tokens + 6 * longest + 16
    sched = make_scheduler(target, rows=(1,), gamma=longest, max_len=max_len)
    result = sweep(
        sched, pairs, prompts, rtts_ms=p.adaptive.rtts_ms, longest=longest,
        new_tokens=new_tokens,
    )  # fmt: skip
    return result | {
        "command": ctx.command,
        "longest": longest,
        "new_tokens": new_tokens,
        "prompts": len(prompts),
        "cpus": os.cpu_count(),
        "load_average_1min_end": os.getloadavg()[0],
    }


SECTION = Section("adaptive", run_section, failures=lambda r: list(r["failures"]))
