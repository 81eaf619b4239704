"""Inter-token latency over a simulated WAN: cloud autoregressive, co-located speculative,
sync edge-cloud and pipelined edge-cloud decoding, measured next to the papers' model.

Everything runs in this process: the edge drafter (`edge.Drafter`), the verifier
(`verify.LocalVerifier`) behind `edge.DelayedEndpoint` (one-way delay RTT/2 each way, FIFO).
t_d (draft time per token), t_v (one verify step) and t_ar (one target decode step) are
measured first, alpha from co-located speculative decoding of the same prompt; the
predictions are `jaxspec.decoding.analytic` at those numbers. Cloud autoregressive and
co-located speculative decoding stream tokens the cloud computes, so their inter-token
latency is their measured compute time per token (the RTT delays only the first token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax

import jaxspec
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.decoding import analytic
from jaxspec.decoding.sampling import SamplingParams, session_key
from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.common import best_time, make_scheduler
from jaxspec_apps.bench.section import Context, Section, sizes
from verify import LocalVerifier

# This section's sizes (the RTT sweep).
Config = sizes(
    "latency_", rtts_ms=(0, 5, 20, 50, 100, 200), new_tokens=64, flags={"rtts_ms": "rtts_ms"}
)


QUICK_SIZES = Config(rtts_ms=(0, 50), new_tokens=12)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=8)
REAL_SIZES = Config(rtts_ms=(0, 20, 50, 100), new_tokens=32)

MODES = ("cloud_ar", "colocated", "sync", "pipelined")


def pipeline_depth(rtt: float, t_v: float, t_d: float, gamma: int) -> int:
    """Blocks in flight that cover a round trip plus a verification, capped at 8: the
    papers' depth (blocks in flight while the next one is drafted)."""
    return max(1, min(8, math.ceil((rtt + t_v) / max(gamma * t_d, 1e-9))))


def session_depth(rtt: float, t_v: float, t_d: float, gamma: int) -> int:
    """The edge session's depth that keeps its drafter busy: `pipeline_depth` + 1, capped at
    8 (a verifier queues at most 8 blocks per session by default). A session drafts a block
    only while fewer than `depth` are in flight, so while it drafts, depth - 1 are: the
    papers' depth is the session's minus one (at depth 1 a pipelined session drafts nothing
    while its block is out: a sync round without the bonus)."""
    return min(8, pipeline_depth(rtt, t_v, t_d, gamma) + 1)


def measure_components(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    gamma: int,
    new_tokens: int,
    temperature: float,
    repeats: int,
    scheduler: Any = None,
) -> dict[str, float]:
    """t_ar, t_d, t_v (seconds), co-located speculative time per token and its alpha."""

    prompt = list(prompt)
    plain, _ = best_time(
        lambda: jaxspec.generate(target, prompt, new_tokens, temperature=temperature), repeats
    )
    t_spec, o = best_time(
        lambda: jaxspec.generate(
            target, prompt, new_tokens, temperature=temperature, draft=draft, gamma=gamma
        ),
        repeats,
    )
    drafter = Drafter(
        draft, DraftSpec(gamma=gamma, encoding="onehot" if temperature == 0 else "full")
    )
    state = drafter.prefill(drafter.init(1, len(prompt) + 8 * gamma), [prompt])
    params = SamplingParams.make(1, temperature)
    keys = session_key(0, 0)[None]

    def one_block() -> None:
        _, blk = drafter.draft(state, params, keys)
        jax.block_until_ready(blk.tokens)

    t_block, _ = best_time(one_block, repeats * 3)
    sched = scheduler or make_scheduler(
        target, rows=(1,), gamma=gamma, max_len=len(prompt) + 4 * gamma + 16
    )
    cfg = SessionConfig(
        prompt=tuple(prompt),
        max_new_tokens=gamma + 1,
        sampling=SamplingSettings(temperature=0.0),
        draft=DraftSpec(gamma=gamma, encoding="onehot"),
    )
    times = []
    for _ in range(repeats * 3):
        sid = sched.open(cfg).session_id
        while not sched.sessions[sid].ready_to_verify:
            sched.tick()
        jax.block_until_ready(sched.cache)  # the prefill is dispatched, not done: not t_v
        sched.submit(DraftBlock(session_id=sid, epoch=0, start=len(prompt), tokens=(0,) * gamma))
        sched.tick()
        times.append(sched.metrics.last_step_s)
        sched.close(sid)
    return {
        "t_ar": plain / new_tokens,
        "t_d": t_block / gamma,
        "t_v": min(times),
        "colocated_token_s": t_spec / o.stats.new_tokens,
        "alpha": o.stats.figures.acceptance_rate,
    }


async def edge_session(
    sched: Any,
    draft: Any,
    prompt: Sequence[int],
    mode: str,
    gamma: int,
    depth: int,
    rtt_s: float,
    new_tokens: int,
    temperature: float,
) -> tuple[float, float]:
    """One edge session against a `LocalVerifier` over `sched` behind a delayed link:
    (time per token after the first round trip, alpha)."""

    enc = "onehot" if temperature == 0 else "full"
    v = LocalVerifier(scheduler=sched)
    ep = DelayedEndpoint(v, one_way_s=rtt_s / 2)
    cfg = SessionConfig(
        prompt=tuple(prompt),
        max_new_tokens=new_tokens,
        mode=mode,
        sampling=SamplingSettings(temperature=temperature),
        draft=DraftSpec(gamma=gamma, encoding=enc),
    )
    try:
        tr = await run_session(ep, Drafter(draft, cfg.draft), cfg, depth=depth)
    finally:
        await v.aclose()
    return (tr.end_time - tr.start_time - rtt_s) / len(tr.tokens), tr.figures.acceptance_rate


def predict(comp: dict[str, float], gamma: int, rtt: float, depth: int) -> dict[str, float]:
    """The model's time per token of every mode at measured t_d, t_v, t_ar and alpha."""
    td, tv, a = comp["t_d"], comp["t_v"], comp["alpha"]
    return {
        "cloud_ar": comp["t_ar"],
        "colocated": analytic.colocated_token_time(gamma, a, td, tv),
        "sync": analytic.sync_token_time(gamma, a, td, rtt, tv),
        "pipelined": analytic.pipelined_token_time(gamma, a, td, rtt, tv, depth),
    }


def run(
    target: Any,
    draft: Any,
    *,
    gamma: int,
    new_tokens: int,
    temperature: float,
    rtts_ms: Sequence[float],
    repeats: int,
    prompt: Sequence[int],
    scheduler: Any = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(measured components, one row per RTT with measured and predicted time per token of
    each mode). `scheduler` (a warmed-up `verify.Scheduler` with row buckets 1 and 2) is
    shared with other sections when given."""

    sched = scheduler or make_scheduler(
        target, rows=(1, 2), gamma=gamma, max_len=len(prompt) + new_tokens + 10 * gamma + 8
    )
    comp = measure_components(
        target, draft, prompt, gamma, new_tokens, temperature, repeats, scheduler=sched
    )
    rows = []
    for rtt_ms in rtts_ms:
        rtt = rtt_ms / 1e3
        depth = pipeline_depth(rtt, comp["t_v"], comp["t_d"], gamma)
        meas = {}
        for mode, dep in (("sync", 1), ("pipelined", depth)):
            for _ in range(2):  # the first run compiles the drafter for this shape
                meas[mode], _ = asyncio.run(
                    edge_session(sched, draft, prompt, mode, gamma, dep, rtt, new_tokens,
                                 temperature)
                )  # fmt: skip
        rows.append(
            {
                "rtt_ms": rtt_ms,
                "depth": depth,
                "measured": {
                    "cloud_ar": comp["t_ar"],
                    "colocated": comp["colocated_token_s"],
                    **meas,
                },
                "predicted": predict(comp, gamma, rtt, depth),
            }
        )
    return comp, rows


def crossover_ms(rows: list[dict[str, Any]], key: str) -> float | None:
    """The first RTT at which pipelined is slower per token than co-located SD."""
    for r in rows:
        if r[key]["pipelined"] > r[key]["colocated"]:
            return r["rtt_ms"]
    return None


def predicted_crossover_ms(comp: dict[str, float], gamma: int, max_ms: int = 1000) -> float:
    """The smallest RTT (0.5 ms grid) at which the model puts pipelined behind co-located."""
    co = predict(comp, gamma, 0.0, 1)["colocated"]
    for i in range(2 * max_ms):
        rtt = i / 2e3
        depth = pipeline_depth(rtt, comp["t_v"], comp["t_d"], gamma)
        if predict(comp, gamma, rtt, depth)["pipelined"] > co:
            return i / 2
    return float("inf")


def run_section(ctx: Context) -> dict[str, Any]:
    """The RTT sweep on the pass's first prompt, greedy, on the shared verifier."""
    p = ctx.p
    comp, rows = run(
        ctx.target, ctx.draft, gamma=p.gamma, new_tokens=p.latency.new_tokens, temperature=0.0,
        rtts_ms=p.latency.rtts_ms, repeats=p.repeats, prompt=ctx.prompts[0], scheduler=ctx.sched(),
    )  # fmt: skip
    return {
        "gamma": p.gamma,
        "new_tokens": p.latency.new_tokens,
        "components": comp,
        "rows": rows,
        "crossover_ms_measured": crossover_ms(rows, "measured"),
        "crossover_ms_predicted": predicted_crossover_ms(comp, p.gamma),
    }


SECTION = Section("latency", run_section)
