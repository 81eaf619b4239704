"""A fleet of verifier replicas, measured in one run on this machine:

    python tools/bench_fleet.py              # prints the figures
    python tools/bench_fleet.py --out .      # also bench/fleet.{json,md} and the "A fleet of
                                             # verifiers" section of BENCHMARKS.md

1. Aggregate committed tokens/s of `--sessions` closed-loop clients (each running sessions back
   to back for `--seconds`) over 1 replica, then over 2 (`--verifier a,b`: gRPC round_robin).
2. Failover: the same sessions over 2 replicas, one SIGKILLed once the sessions have committed
   a quarter of their tokens; for every session that moved, the seconds from the kill to its
   next committed token; and whether every session's tokens equal the undisturbed run's.

Replicas are `python -m verify serve` processes of the shipped target (`--target`), clients
draft with the shipped draft at W4A16, pipelined, gamma 4, T = 1. Everything shares this
machine's cores: see the section's note on what 2 replicas give on separate hosts.
Exit status 1 if a session's tokens differ after the failover.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jaxspec
from edge.drafter import load_drafter
from edge.session import run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.common import heldout_stream, prompts_from
from jaxspec_apps.bench.fleet import Fault, connected
from jaxspec_apps.bench.report import write_tool_section
from verify.process import VerifierProcess


def configs(target: str, n: int, new_tokens: int) -> list[SessionConfig]:
    prompts = prompts_from(heldout_stream(jaxspec.load(target)), n, 16, seed=5)
    spec = DraftSpec(gamma=4, encoding="sparse", sparse_k=8)
    return [
        SessionConfig(prompt=tuple(p), max_new_tokens=new_tokens,
                      sampling=SamplingSettings(temperature=1.0), seed=i,
                      mode="pipelined", draft=spec)
        for i, p in enumerate(prompts)
    ]  # fmt: skip


async def throughput(addresses: list[str], drafter, cfgs, seconds: float) -> dict:
    """Closed loop: each config's worker runs its session again and again for `seconds`."""
    ep = await connected(addresses, timeout_s=60)
    tokens = [0]
    sessions = [0]
    stop = time.perf_counter() + seconds

    async def worker(cfg):
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


async def failover(servers: list[VerifierProcess], drafter, cfgs) -> tuple[dict, list]:
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


def markdown(r: dict) -> str:
    one, two = r["throughput"]
    f = r["failover"]
    return "\n".join([
        "## A fleet of verifiers",
        "",
        f"Measured by `{r['command']}` on this machine ({os.cpu_count()} cores; the replicas and",
        "the clients' drafters share them). Target and draft: the shipped pair; clients draft",
        "at W4A16, pipelined, gamma 4, sparse q, T = 1.",
        "",
        "| replicas | sessions run | committed tokens | seconds | tokens/s |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {t['replicas']} | {t['sessions']} | {t['tokens']} | {t['seconds']} | "
          f"{t['tokens_per_s']} |" for t in (one, two)),
        "",
        f"2 replicas ÷ 1: **{r['scaling']:.2f}x** aggregate tokens/s. On one 2-core machine",
        "the replicas take cores from each other and from the drafters, so no gain is expected",
        "here. Replicas share nothing (a session lives in one stream on one replica), so on",
        "separate hosts each adds its own capacity: by the capacity model, N replicas hold N",
        "times the clients at the same per-client rate, up to what the network and the",
        "balancer carry.",
        "",
        f"Failover: {f['sessions']} sessions over 2 replicas, one SIGKILLed after a quarter of",
        f"the tokens: {f['sessions_moved']} sessions moved ({f['resumes']} resumes); from the",
        f"kill to a moved session's next committed token: median {f['move_s_median']} s, max",
        f"{f['move_s_max']} s. Tokens equal to the undisturbed run: "
        f"**{'yes' if f['tokens_equal'] else 'NO'}** (0 lost, 0 repeated).",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--draft", default="default-draft")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="directory holding BENCHMARKS.md and bench/")
    args = p.parse_args(argv)
    cfgs = configs(args.target, args.sessions, args.new_tokens)
    drafter = load_drafter(args.draft, "w4a16", cfgs[0].draft)
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tempfile.mkdtemp(prefix="jaxspec-xla-")
    env = {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
    flags = ["--checkpoint", args.target, "--max-sessions", str(args.sessions), "--max-len", "256"]
    servers = [VerifierProcess(flags, env=env).start() for _ in range(2)]
    try:
        for s in servers:
            s.wait_ready(900)
        addresses = [s.address for s in servers]
        print("warming up the clients ...", file=sys.stderr)
        asyncio.run(throughput(addresses, drafter, cfgs[:2], 2.0))
        runs = [asyncio.run(throughput(addresses[:n], drafter, cfgs, args.seconds)) for n in (1, 2)]
        for t in runs:
            print(t)
        reference = asyncio.run(_reference(addresses, drafter, cfgs))
        fig, tokens = asyncio.run(failover(servers, drafter, cfgs))
        fig["tokens_equal"] = tokens == reference
        print(fig)
    finally:
        for s in servers:
            s.stop()
    command = "python tools/bench_fleet.py" + (" " + " ".join(argv) if argv else "")
    result = dict(
        command=command.replace(" --out .", ""),
        throughput=runs,
        scaling=runs[1]["tokens_per_s"] / runs[0]["tokens_per_s"],
        failover=fig,
    )
    md = markdown(result)
    print(md)
    if args.out is not None:
        write_tool_section(pathlib.Path(args.out), "fleet", result, md)
    return 0 if fig["tokens_equal"] else 1


async def _reference(addresses: list[str], drafter, cfgs) -> list:
    ep = await connected(addresses, timeout_s=60)
    traces = await asyncio.gather(*(run_session(ep, drafter, c, depth=2) for c in cfgs))
    await ep.aclose()
    return [t.tokens for t in traces]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
