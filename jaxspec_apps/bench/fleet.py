"""Faults injected into sessions running over a fleet of verifiers, and what they cost: what
the `fleet` section measures and the fault tests (tests/test_fleet.py, test_deploy.py,
test_grpc_faults.py) assert on.

The section (`SECTION`, run only when named: `jaxspec bench --pairs tiny --sections fleet`):

1. Aggregate committed tokens/s of `fleet_sessions` closed-loop clients (each running sessions
   back to back for `fleet_seconds`) over 1 replica, then over 2 (gRPC round_robin).
2. Failover: the same sessions over 2 replicas, one SIGKILLed once the sessions have committed
   a quarter of their tokens; for every session that moved, the seconds from the kill to its
   next committed token; and whether every session's tokens equal the undisturbed run's.

Replicas are `python -m verify serve` processes of the tiny pair's target, clients draft with
its draft at W4A16, pipelined, gamma 4, T = 1. Everything shares this machine's cores: see the
section's note on what 2 replicas give on separate hosts. A session whose tokens differ after
the failover fails the command.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from edge.client import GrpcEndpoint
from edge.drafter import load_drafter
from edge.session import run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.common import prompts_from
from jaxspec_apps.bench.section import Context, Section, sizes
from verify.process import VerifierProcess

# This section's sizes (verifier replicas (subprocesses), closed-loop clients, a SIGKILL).
Config = sizes("fleet_", sessions=8, seconds=30.0, new_tokens=64)


QUICK_SIZES = Config(sessions=2, seconds=2.0, new_tokens=16)

COMMITS = ("accept", "correct", "bonus")  # the session events that commit tokens


class Fault:
    """`act()` (kill a replica, SIGTERM it, ...) run once, as soon as the sessions fed to it
    have committed `after` tokens between them. Afterwards `moved[i]` is, for each session `i`
    that resumed, the seconds from the fault to its next committed token. Feed it every
    session's events: `on_event(i, kind, tokens)`, or `session(i)` as `run_session`'s
    `on_event`."""

    def __init__(self, after: int, act: Callable[[], None]):
        self.after = after
        self.act = act
        self.committed = 0
        self.at: float | None = None  # perf_counter time of the fault
        self.resumed: set[int] = set()
        self.moved: dict[int, float] = {}
        self._lock = threading.Lock()

    @property
    def happened(self) -> bool:
        return self.at is not None

    def on_event(self, i: int, kind: str, tokens: Sequence[int]) -> None:
        with self._lock:
            if kind == "resume":
                self.resumed.add(i)
            if kind in COMMITS and tokens:
                self.committed += len(tokens)
                if self.at is not None and i in self.resumed and i not in self.moved:
                    self.moved[i] = time.perf_counter() - self.at
            if self.at is None and self.committed >= self.after:
                self.act()
                self.at = time.perf_counter()

    def session(self, i: int) -> Callable[[str, Sequence[int]], None]:
        return lambda kind, tokens: self.on_event(i, kind, tokens)


async def connected(addresses: Sequence[str], **kw: object) -> GrpcEndpoint:
    """A fleet endpoint over `addresses` that has connected to every replica: gRPC's
    round_robin picks among the replicas connected so far, so sessions opened at once on a
    brand-new channel would all go to the first one."""
    ep = GrpcEndpoint(",".join(addresses), **kw)
    await ep.stats()
    await asyncio.sleep(1.0)
    return ep


def configs(ctx: Context) -> list[SessionConfig]:
    """One session config per client: held-out prompts, sparse q, pipelined, T = 1."""
    p = ctx.p
    prompts = prompts_from(ctx.stream, p.fleet.sessions, 16, seed=5)
    spec = DraftSpec(gamma=4, encoding="sparse", sparse_k=8)
    return [
        SessionConfig(prompt=tuple(q), max_new_tokens=p.fleet.new_tokens,
                      sampling=SamplingSettings(temperature=1.0), seed=i, mode="pipelined",
                      draft=spec)
        for i, q in enumerate(prompts)
    ]  # fmt: skip


async def throughput(
    addresses: list[str], drafter: Any, cfgs: list[SessionConfig], seconds: float
) -> dict[str, Any]:
    """Closed loop: each config's worker runs its session again and again for `seconds`."""
    ep = await connected(addresses, timeout_s=60)
    tokens = [0]
    sessions = [0]
    stop = time.perf_counter() + seconds

    async def worker(cfg: SessionConfig) -> None:
        while time.perf_counter() < stop:
            trace = await run_session(ep, drafter, cfg, depth=2)
            tokens[0] += len(trace.tokens)
            sessions[0] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in cfgs))
    wall = time.perf_counter() - t0
    await ep.aclose()
    return dict(replicas=len(addresses), sessions=sessions[0], tokens=tokens[0],
                seconds=round(wall, 2), tokens_per_s=round(tokens[0] / wall, 1))  # fmt: skip


async def failover(
    servers: list[VerifierProcess], drafter: Any, cfgs: list[SessionConfig]
) -> tuple[dict[str, Any], list[list[int]]]:
    """The sessions over every replica, servers[0] SIGKILLed mid-run: (figures, tokens)."""
    ep = await connected([s.address for s in servers], timeout_s=60)
    fault = Fault(sum(c.max_new_tokens for c in cfgs) // 4, servers[0].kill)
    traces = await asyncio.gather(
        *(
            run_session(ep, drafter, c, depth=2, resume_timeout_s=60, on_event=fault.session(i))
            for i, c in enumerate(cfgs)
        )
    )
    await ep.aclose()
    secs = sorted(fault.moved.values())
    figures = dict(
        sessions=len(cfgs),
        sessions_moved=len(fault.moved),
        resumes=sum(t.resumes for t in traces),
        move_s_median=round(statistics.median(secs), 3) if secs else None,
        move_s_max=round(max(secs), 3) if secs else None,
    )
    return figures, [t.tokens for t in traces]


async def reference(
    addresses: list[str], drafter: Any, cfgs: list[SessionConfig]
) -> list[list[int]]:
    """Every session's tokens, undisturbed, over the replicas."""
    ep = await connected(addresses, timeout_s=60)
    traces = await asyncio.gather(*(run_session(ep, drafter, c, depth=2) for c in cfgs))
    await ep.aclose()
    return [t.tokens for t in traces]


def _measure(servers: list[VerifierProcess], drafter: Any, cfgs: list[SessionConfig],
             seconds: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Throughput over 1 then 2 replicas, then the failover, on started `servers`."""
    for s in servers:
        s.wait_ready(900)
    addresses = [s.address for s in servers]
    print("warming up the clients ...", file=sys.stderr)
    asyncio.run(throughput(addresses, drafter, cfgs[:2], 2.0))
    runs = [asyncio.run(throughput(addresses[:n], drafter, cfgs, seconds)) for n in (1, 2)]
    for t in runs:
        print(t)
    undisturbed = asyncio.run(reference(addresses, drafter, cfgs))
    fig, tokens = asyncio.run(failover(servers, drafter, cfgs))
    fig["tokens_equal"] = tokens == undisturbed
    print(fig)
    return runs, fig


def run_section(ctx: Context) -> dict[str, Any]:
    """Two `python -m verify serve` replicas of the tiny pair's target; the figures."""
    p = ctx.p
    cfgs = configs(ctx)
    drafter = load_drafter(ctx.draft_name, "w4a16", cfgs[0].draft)
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tempfile.mkdtemp(prefix="jaxspec-xla-")
    env = {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
    flags = ["--checkpoint", ctx.target_name, "--max-sessions", str(p.fleet.sessions),
             "--max-len", "256"]  # fmt: skip
    servers = [VerifierProcess(flags, env=env).start() for _ in range(2)]
    try:
        runs, fig = _measure(servers, drafter, cfgs, p.fleet.seconds)
    finally:
        for s in servers:
            s.stop()
    return {
        "command": ctx.command,
        "cpus": os.cpu_count(),
        "throughput": runs,
        "scaling": runs[1]["tokens_per_s"] / runs[0]["tokens_per_s"],
        "failover": fig,
    }


def _failures(r: dict[str, Any]) -> list[str]:
    ok = r["failover"]["tokens_equal"]
    return [] if ok else ["a session's tokens differ from the undisturbed run after the failover"]


SECTION = Section("fleet", run_section, failures=_failures)
