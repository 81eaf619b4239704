"""The `round_profile` section (run only when named: `jaxspec bench --pairs real --sections
round_profile`): where a round's wall time goes in each mode, beyond the draft and verify
steps themselves.

Each mode decodes one chat prompt at T = 0 after a warm-up run (every shape compiled), once
under `cProfile`:

    colocated       jaxspec.generate(target, draft=...), gamma 4
    edge sync       an edge session against an in-process verifier (`LocalVerifier`), RTT 0
    edge pipelined  the same, pipelined (depth 2)
    plain           jaxspec.generate(target) (one target step per token: the yardstick)

Every profiled function's own time (cProfile's tottime) falls into one bucket:

    device          the host waiting for the device: reading an array's value (np.asarray,
                    block_until_ready, device_get): on the CPU this is the model's compute
    idle            the event loop with nothing to do: waiting for the verifier's thread
    dispatch        calling a jitted function (the C++ dispatch path and JAX's Python around it)
    jaxspec         our Python (jaxspec/, edge/, verify/): the session loop, q, checks
    asyncio, grpc   the event loop and gRPC
    other           the rest (numpy, the standard library)

The profiler slows Python calls (several microseconds each), so the buckets are shares of a
profiled run, not of an unprofiled one; the unprofiled time per token is measured beside it.

Where an edge session stalls (its unprofiled run's `SessionTrace.stalls()`): drafting that
was kept or thrown away (rejected drafts, blocks a rejection made stale), waiting for an
answer through the verifier's step, beyond it (the wire, the queue, the answer's hop from
the verifier's thread into the event loop), for stale answers, and the session's own host
time. One more edge mode runs the pipelined session behind a simulated round trip
(`stall_rtt_ms`, `edge.delayed.DelayedEndpoint`) at the depth that keeps its drafter busy
(`latency.session_depth`), so the wire's share shows.

Before the modes: `programs` times each jitted program against the forwards it is made of
(the `program_vs_parts` table).
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import jaxspec
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import SessionTrace, run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec.quant.calibration import prompt_ids
from jaxspec_apps.bench import device_account, programs
from jaxspec_apps.bench.common import make_scheduler
from jaxspec_apps.bench.latency import session_depth
from jaxspec_apps.bench.section import Context, Section, sizes
from verify import LocalVerifier

# This section's sizes (program_vs_parts' turns (best kept) and verify step rows; the pipelined
# edge's link).
Config = sizes(
    "round_profile_",
    new_tokens=64,
    turns=9,
    rows=(1, 2, 4),
    stall_rtt_ms=50.0,
    flags={"turns": "program_turns", "rows": "program_rows", "stall_rtt_ms": "stall_rtt_ms"},
)


QUICK_SIZES = Config(new_tokens=8, turns=1, rows=(1, 2))

BUCKETS = ("device", "idle", "dispatch", "jaxspec", "asyncio", "grpc", "other")
DEVICE_WAIT = ("block_until_ready", "_value", "__array__", "device_get", "_to_np_array", "asarray")
IDLE = ("epoll", "select", "kqueue")
OURS = ("/jaxspec/", "/edge/", "/verify/")


def bucket(func: tuple[str, int, str]) -> str:
    """The bucket of one pstats entry (file, line, function name)."""
    path, _, name = func
    if any(w in name for w in DEVICE_WAIT):
        return "device"
    if "poll" in name and any(w in name for w in IDLE):
        return "idle"
    if "PjitFunction" in name or "/jax/_src/pjit.py" in path or "/jax/_src/api.py" in path:
        return "dispatch"
    if any(d in path for d in OURS) and "site-packages" not in path:
        return "jaxspec"
    if "/asyncio/" in path:
        return "asyncio"
    if "grpc" in path or "grpc" in name:
        return "grpc"
    return "other"


def profile(run: Callable[[], int]) -> dict[str, Any]:
    """Run `run` (returns the tokens it made) unprofiled and profiled: time per token and
    the profiled run's shares per bucket, with its top functions."""
    run()  # warm-up: every shape compiled
    t0 = time.perf_counter()
    tokens = run()
    plain_s = (time.perf_counter() - t0) / tokens
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(run)
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # func -> (cc, nc, tottime, cumtime, callers)
    spent = dict.fromkeys(BUCKETS, 0.0)
    for func, (_, _, tottime, _, _) in stats.items():
        spent[bucket(func)] += tottime
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:8]
    return {
        "s_per_token": plain_s,
        "profiled_s_per_token": wall / tokens,
        "shares": {k: v / wall for k, v in spent.items()},
        "top": [
            {
                "function": f"{f[2]} ({f[0].rsplit('/', 1)[-1]}:{f[1]})",
                "calls": s[1],
                "ms_per_token": 1e3 * s[2] / tokens,
            }
            for f, s in top
        ],
    }


def _edge(
    ctx: Context, prompt: list[int], mode: str, n: int, depth: int, rtt_s: float,
    traces: list[SessionTrace],
) -> Callable[[], int]:  # fmt: skip
    """One edge session per call (in-process verifier, behind a simulated round trip of
    `rtt_s`), its trace appended to `traces`; returns the tokens it made."""
    g = ctx.p.gamma
    cfg = SessionConfig(prompt=tuple(prompt), max_new_tokens=n, mode=mode,
                        sampling=SamplingSettings(temperature=0.0),
                        draft=DraftSpec(gamma=g, encoding="onehot"))  # fmt: skip
    sched = make_scheduler(
        ctx.target, rows=(1,), gamma=g, max_len=len(prompt) + n + (depth + 3) * g + 16
    )
    drafter = Drafter(ctx.draft, cfg.draft)

    async def session() -> int:
        v = LocalVerifier(scheduler=sched)
        link = DelayedEndpoint(v, one_way_s=rtt_s / 2) if rtt_s else v
        try:
            tr = await run_session(link, drafter, cfg, depth=depth)
        finally:
            await v.aclose()
        traces.append(tr)
        return len(tr.tokens)

    return lambda: asyncio.run(session())


def stall_shares(tr: SessionTrace) -> dict[str, float]:
    """A session's `stalls()` as shares of its wall time."""
    wall = tr.end_time - tr.start_time
    return {k: v / wall for k, v in tr.stalls().items()}


ACCOUNT = ("draft forwards", "draft sampling (q)", "verify forward", "rule and commit",
           "copies", "loop and other")  # fmt: skip
PREFILL = ("prefill: target (per call)", "prefill: draft (per call)")


def colocated_part(instruction: str, op_name: str) -> str:
    """The part of `speculative_decode` an op belongs to, by the scopes of its op_name."""
    if "prefill_target" in op_name:
        return PREFILL[0]
    if "prefill_draft" in op_name:
        return PREFILL[1]
    if "round_draft" in op_name:
        return "draft forwards" if "/Llama/" in op_name else "draft sampling (q)"
    if "round_target" in op_name:
        return "verify forward"
    if "round_rule" in op_name:
        return "rule and commit"
    return "copies" if instruction.startswith("copy") else "loop and other"


def colocated_account(target: Any, draft: Any, prompt: list[int], gamma: int, n: int) -> dict:
    """One co-located call (`speculative_decode`, T = 0, full q, as `generate` runs it) under
    `jax.profiler`: each part's thread time per round (prefill: per call), the program's wall
    per round and the host's time around it per call (device_account.py)."""
    call, compiled = programs.colocated_call(target, draft, prompt, gamma, n)
    call()  # warm
    t0 = time.perf_counter()
    rounds = call()[1].to_figures().rounds
    wall = time.perf_counter() - t0
    events = device_account.traced(call)
    acc = device_account.account(events, device_account.op_names(compiled), colocated_part)
    acc["host_s"] = max(wall - acc["device_wall_s"], 0.0)  # unprofiled wall less the device's
    per = {k: v / (1 if k.startswith("prefill") else rounds) for k, v in acc["parts_s"].items()}
    return {"rounds": rounds, "gamma": gamma, "new_tokens": n, "parts_s": per,
            "device_wall_s": acc["device_wall_s"], "host_s": acc["host_s"]}  # fmt: skip


def run_section(ctx: Context) -> dict[str, Any]:
    """The program_vs_parts table, then every mode profiled on the same prompt and each edge
    mode's stalls."""
    p, n = ctx.p, ctx.p.round_profile.new_tokens
    prompt = list(prompt_ids(ctx.target, p.two_process.chat))
    parts = programs.measure(ctx, p.round_profile.turns, p.round_profile.rows)
    by = {r["program"]: r["measured_s"] for r in parts["rows"]}
    t_d, t_v = by["drafter round"] / p.gamma, by[f"verify step 1x{p.gamma + 1}"]
    rtt = p.round_profile.stall_rtt_ms / 1e3
    deep = session_depth(rtt, t_v, t_d, p.gamma)

    def gen(**kw: Any) -> Callable[[], int]:
        def run() -> int:
            return jaxspec.generate(ctx.target, prompt, n, temperature=0.0, **kw).stats.new_tokens

        return run

    traces: dict[str, list[SessionTrace]] = {}
    stalled = f"edge pipelined, {p.round_profile.stall_rtt_ms:g} ms"
    edges = {"edge sync": ("sync", 1, 0.0), "edge pipelined": ("pipelined", 2, 0.0),
             stalled: ("pipelined", deep, rtt)}  # fmt: skip
    modes = {"plain": gen(), "colocated": gen(draft=ctx.draft, gamma=p.gamma)}
    for name, (mode, depth, r) in edges.items():
        modes[name] = _edge(ctx, prompt, mode, n, depth, r, traces.setdefault(name, []))
    rows = {name: profile(run) for name, run in modes.items()}
    for name, (_, depth, r) in edges.items():  # the unprofiled run's trace (warm-up first)
        rows[name] |= {"depth": depth, "rtt_ms": r * 1e3, "stalls": stall_shares(traces[name][1])}
    account = colocated_account(ctx.target, ctx.draft, prompt, p.gamma, n)
    return {"command": ctx.command, "gamma": p.gamma, "new_tokens": n, "modes": rows,
            "program_vs_parts": parts, "device_account": account}  # fmt: skip


SECTION = Section("round_profile", run_section)
