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
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import jaxspec
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec.quant.calibration import prompt_ids
from jaxspec_apps.bench.common import make_scheduler
from jaxspec_apps.bench.section import Context, Page, Section
from verify import LocalVerifier

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


def _edge(ctx: Context, prompt: list[int], mode: str, n: int) -> Callable[[], int]:
    g = ctx.p.gamma
    cfg = SessionConfig(prompt=tuple(prompt), max_new_tokens=n, mode=mode,
                        sampling=SamplingSettings(temperature=0.0),
                        draft=DraftSpec(gamma=g, encoding="onehot"))  # fmt: skip
    sched = make_scheduler(ctx.target, rows=(1,), gamma=g, max_len=len(prompt) + n + 4 * g + 16)
    drafter = Drafter(ctx.draft, cfg.draft)

    async def session() -> int:
        v = LocalVerifier(scheduler=sched)
        try:
            tr = await run_session(v, drafter, cfg, depth=2 if mode == "pipelined" else 1)
        finally:
            await v.aclose()
        return len(tr.tokens)

    return lambda: asyncio.run(session())


def run_section(ctx: Context) -> dict[str, Any]:
    """Every mode profiled on the same prompt."""
    p, n = ctx.p, ctx.p.round_profile_new_tokens
    prompt = list(prompt_ids(ctx.target, p.two_process_chat))

    def gen(**kw: Any) -> Callable[[], int]:
        def run() -> int:
            return jaxspec.generate(ctx.target, prompt, n, temperature=0.0, **kw).stats.new_tokens

        return run

    modes = {
        "plain": gen(),
        "colocated": gen(draft=ctx.draft, gamma=p.gamma),
        "edge sync": _edge(ctx, prompt, "sync", n),
        "edge pipelined": _edge(ctx, prompt, "pipelined", n),
    }
    rows = {name: profile(run) for name, run in modes.items()}
    return {"command": ctx.command, "gamma": p.gamma, "new_tokens": n, "modes": rows}


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "where a round's time goes" section of BENCHMARKS.md."""
    plain = r["modes"]["plain"]["s_per_token"]
    lines = [
        "## Where a round's time goes (profile per mode)",
        "",
        f"Produced by `{r['command']}`: one chat prompt, {r['new_tokens']} new tokens, T = 0, "
        f"gamma {r['gamma']}, after a warm-up; each mode once unprofiled (ms per token) and "
        "once under cProfile, its functions' own time in buckets (jaxspec_apps/bench/"
        "roundprofile.py: device = the host waiting for the model's compute; dispatch = "
        "calling jitted functions; idle = the event loop waiting for the verifier's thread; "
        "jaxspec = our Python). The profiler inflates the Python "
        "buckets: read them as where to look, not as exact costs.",
        "",
        "| mode | ms/token | × plain | " + " | ".join(BUCKETS) + " |",
        "|---|---:|---:|" + "---:|" * len(BUCKETS),
    ]
    for name, m in r["modes"].items():
        shares = " | ".join(f"{100 * m['shares'][b]:.0f}%" for b in BUCKETS)
        lines.append(f"| {name} | {m['s_per_token'] * 1e3:.1f} | "
                     f"{m['s_per_token'] / plain:.2f} | {shares} |")  # fmt: skip
    for name, m in r["modes"].items():
        top = "; ".join(f"{t['function']} {t['ms_per_token']:.2f}" for t in m["top"][:5])
        lines += ["", f"Top own time, {name} (ms per token, profiled): {top}."]
    return lines


SECTION = Section("round_profile", run_section, markdown)
