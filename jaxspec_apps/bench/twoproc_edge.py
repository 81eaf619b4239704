"""The edge half of the `two_process` section: a process of its own, pinned to one core,
that drafts against a verifier in another process over real gRPC on loopback, through a
simulated round trip (`edge.delayed.DelayedEndpoint`), and prints its figures as one JSON line.

    python -m jaxspec_apps.bench.twoproc_edge --verifier 127.0.0.1:PORT --draft smollm2-w4a16 \
        --chat 'Explain recursion.' --gamma 4 --new-tokens 64 --rtts-ms 0,20,50,100 --core 1

For each round trip: the pipelined and the sync edge session (the W4A16 draft, gamma), and
the verifier's gamma-0 sessions, pipelined with GAMMA0_DEPTH empty blocks in flight (a
stream through the verifier, `cloud_gamma0`) and one block at a time (a round trip per
token, `cloud_gamma0_sync`), each the best of `repeats` (time per token after the first
round trip, as the in-process sweep), with the best run's `SessionTrace.stalls()`; at T = 0
every session must
commit the same tokens (`tokens_differ` names any that did not). The pipelined session runs
at `latency.session_depth` (the papers' depth, `depth`, plus the block being drafted). Before
them: the draft's time per drafted token on this core (`t_d`, a block of `gamma` / gamma) and
the verifier's step (`t_v`, its Stats' last step after a sync block). The core is taken by
every thread of the process before JAX starts its own, which inherit it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from edge.client import GrpcEndpoint
from edge.delayed import DelayedEndpoint
from edge.drafter import load_drafter
from edge.session import run_session
from jaxspec.decoding.sampling import SamplingParams, session_key
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec.quant.calibration import prompt_ids
from jaxspec_apps.bench.latency import pipeline_depth, session_depth

GAMMA0_DEPTH = 8  # empty blocks in flight (a verifier queues at most 8 per session)


def pin(core: int | None) -> list[int]:
    """Run every thread of this process on `core` only (threads made later inherit it from
    the thread that makes them), if given and present; returns the cores it may run on."""
    if core is not None and hasattr(os, "sched_setaffinity") and core < (os.cpu_count() or 1):
        for tid in os.listdir("/proc/self/task"):  # Linux: affinity is per thread
            os.sched_setaffinity(int(tid), {core})
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _draft_time(drafter: Any, prompt: list[int], gamma: int, repeats: int) -> float:
    """Seconds per drafted token: the best of `repeats` blocks of `gamma` drafts, each a
    session's round (`Drafter.round`, the state donated) after a one-token answer."""
    state = drafter.prefill(drafter.init(1, len(prompt) + 8 * gamma), [prompt])
    params, keys = SamplingParams.make(1, 0.0), session_key(0, 0)[None]
    best = float("inf")
    for _ in range(repeats + 1):  # the first one compiles
        t0 = time.perf_counter()
        state, blk = drafter.round(state, [len(prompt)], [[5]], [1], params, keys)
        jax.block_until_ready(blk.tokens)
        best = min(best, time.perf_counter() - t0)
    return best / gamma


async def _session(
    address: str, drafter: Any, prompt: list[int], gamma: int, mode: str, depth: int,
    rtt: float, new_tokens: int,
) -> tuple[float, float, list[int], dict[str, float]]:  # fmt: skip
    """One session through a delayed gRPC link: (seconds per token after the first round
    trip, acceptance rate, the tokens, its wall time's split as shares)."""
    cfg = SessionConfig(
        prompt=tuple(prompt), max_new_tokens=new_tokens, mode=mode,
        sampling=SamplingSettings(temperature=0.0),
        draft=DraftSpec(gamma=gamma, encoding="onehot"),
    )  # fmt: skip
    async with GrpcEndpoint(address) as ep:
        tr = await run_session(DelayedEndpoint(ep, one_way_s=rtt / 2), drafter if gamma else None,
                               cfg, depth=depth)  # fmt: skip
    wall = tr.end_time - tr.start_time
    stalls = {k: v / wall for k, v in tr.stalls().items()}
    return (wall - rtt) / len(tr.tokens), tr.figures.acceptance_rate, list(tr.tokens), stalls


async def _step_s(address: str) -> float:
    async with GrpcEndpoint(address) as ep:
        return float((await ep.stats())["last_step_s"])


async def sweep(args: argparse.Namespace, drafter: Any, prompt: list[int]) -> dict[str, Any]:
    """t_d, t_v and every round trip's three sessions (best of `repeats` each)."""
    g, n, addr = args.gamma, args.new_tokens, args.verifier
    t_d = _draft_time(drafter, prompt, g, 3 * args.repeats)
    reference = (await _session(addr, drafter, prompt, g, "sync", 1, 0.0, n))[2]  # warm-up
    t_v = await _step_s(addr)
    rows, differ = [], []
    for rtt_ms in args.rtts_ms:
        rtt = rtt_ms / 1e3
        depth, deep = pipeline_depth(rtt, t_v, t_d, g), session_depth(rtt, t_v, t_d, g)
        row: dict[str, Any] = {"rtt_ms": rtt_ms, "depth": depth, "session_depth": deep}
        kinds = (("pipelined", g, "pipelined", deep), ("sync", g, "sync", 1),
                 ("cloud_gamma0", 0, "pipelined", GAMMA0_DEPTH),
                 ("cloud_gamma0_sync", 0, "sync", 1))  # fmt: skip
        for name, gamma, mode, d in kinds:
            runs = [await _session(addr, drafter, prompt, gamma, mode, d, rtt, n)
                    for _ in range(args.repeats)]  # fmt: skip
            best = min(runs, key=lambda r: r[0])
            row[name], row[f"{name}_alpha"], row[f"{name}_stalls"] = best[0], best[1], best[3]
            differ += [f"{name} at {rtt_ms:g} ms" for r in runs if r[2] != reference]
        rows.append(row)
    return {"t_d": t_d, "t_v": t_v, "rows": rows, "tokens_differ": differ,
            "reference": reference}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--chat", required=True, help="the user message (the draft's chat template)")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rtts-ms", type=lambda s: [float(x) for x in s.split(",")], default=[0.0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--core", type=int, default=None)
    args = p.parse_args(argv)
    cores = pin(args.core)  # before JAX starts its threads (at its first array)
    drafter = load_drafter(args.draft, "w4a16", DraftSpec(gamma=args.gamma, encoding="onehot"))
    prompt = list(prompt_ids(drafter.model, args.chat))
    out = asyncio.run(sweep(args, drafter, prompt))
    print(json.dumps(out | {"cores": cores}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
