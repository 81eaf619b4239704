"""Closed-loop load generator for a verifier service, with a per-session ledger.

    python tools/load_gen.py --verifier localhost:50051 --sessions 16 --seconds 60

N workers each run edge sessions back to back (real drafter, real gRPC) until the time is
up. Every result is checked against the session's ledger: a result must start exactly where
the committed tokens end (a gap is a lost token, an overlap a duplicated one), and what the
session returns must equal its ledger. Prints sessions, tokens/s, p50/p99 round latency,
refusals by status and lost/duplicated tokens; exits 1 if any token was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import pathlib
import sys
import time

from edge.client import GrpcEndpoint, channel_target
from edge.drafter import Drafter, load_drafter
from edge.session import run_session

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from jaxspec.protocol import (
    DraftBlock,
    SamplingSettings,
    SessionConfig,
    SessionInfo,
    VerifierError,
    VerifyResult,
)
from jaxspec_host.flags import add_draft_flags, draft_spec_from_args


@dataclasses.dataclass
class Ledger:
    """What every session committed, as the verifier's answers said, and what went wrong."""

    tokens: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    expect: dict[str, int] = dataclasses.field(default_factory=dict)  # next start per session
    lost: int = 0
    duplicated: int = 0
    mismatched_sessions: int = 0
    round_s: list[float] = dataclasses.field(default_factory=list)
    refused: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    sessions: int = 0
    committed: int = 0

    def opened(self, sid: str, config: SessionConfig) -> None:
        self.tokens[sid] = list(config.committed)
        self.expect[sid] = len(config.prompt) + len(config.committed)

    def result(self, sid: str, r: VerifyResult, dt: float) -> None:
        self.round_s.append(dt)
        if r.stale:
            return
        want = self.expect[sid]
        if r.start > want:
            self.lost += r.start - want
        elif r.start < want:
            self.duplicated += min(want - r.start, len(r.tokens))
        self.tokens[sid] += r.tokens
        self.expect[sid] = r.start + len(r.tokens)
        self.committed += len(r.tokens)


class LedgerEndpoint:
    """Wraps an endpoint: records every answer in the ledger and every refusal by status."""

    def __init__(self, inner, ledger: Ledger):
        self.inner, self.ledger = inner, ledger
        self.sids: list[str] = []

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        try:
            info = await self.inner.open_session(config)
        except VerifierError as e:
            self.ledger.refused[e.code] += 1
            raise
        self.ledger.opened(info.session_id, config)
        self.sids.append(info.session_id)
        return info

    async def verify(self, block: DraftBlock) -> VerifyResult:
        t0 = time.perf_counter()
        try:
            r = await self.inner.verify(block)
        except VerifierError as e:
            self.ledger.refused[e.code] += 1
            raise
        self.ledger.result(block.session_id, r, time.perf_counter() - t0)
        return r

    async def close_session(self, session_id: str) -> None:
        await self.inner.close_session(session_id)


async def worker(i: int, args: argparse.Namespace, drafter: Drafter, ledger: Ledger, until: float):

    prompt = tuple(1 + (i * 7 + j) % 50 for j in range(4 + i % 5))
    n = 0
    async with GrpcEndpoint(args.verifier, token=args.token, tls_ca=args.tls_ca) as ep:
        while time.monotonic() < until:
            cfg = SessionConfig(
                prompt=prompt, max_new_tokens=args.max_new_tokens,
                sampling=SamplingSettings(temperature=1.0),
                seed=1000 * i + n, mode=args.mode,
                draft=drafter.spec,
            )  # fmt: skip
            n += 1
            led = LedgerEndpoint(ep, ledger)
            try:
                trace = await run_session(
                    led, drafter, cfg, depth=args.depth, resume_timeout_s=args.resume_timeout_s
                )
            except VerifierError:
                await asyncio.sleep(0.1)  # counted in `refused`; back off, start anew
                continue
            ledger.sessions += 1
            # A resumed session spans several ids: their ledgers chain into one output.
            chained = ledger.tokens[led.sids[-1]]
            if chained != trace.tokens:
                ledger.mismatched_sessions += 1


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def run_load(args: argparse.Namespace) -> dict:
    """Run the load for `args.seconds` and return the summary (also printed by `main`)."""

    drafter = load_drafter(args.draft, args.quantize, draft_spec_from_args(args))
    ledger = Ledger()
    t0 = time.monotonic()
    until = t0 + args.seconds
    await asyncio.gather(*(worker(i, args, drafter, ledger, until) for i in range(args.sessions)))
    wall = time.monotonic() - t0
    return {
        "concurrent_sessions": args.sessions,
        "sessions_completed": ledger.sessions,
        "seconds": round(wall, 2),
        "tokens": ledger.committed,
        "tokens_per_s": round(ledger.committed / wall, 2),
        "rounds": len(ledger.round_s),
        "round_p50_ms": round(1e3 * percentile(ledger.round_s, 50), 2),
        "round_p99_ms": round(1e3 * percentile(ledger.round_s, 99), 2),
        "refused_by_status": dict(ledger.refused),
        "lost_tokens": ledger.lost,
        "duplicated_tokens": ledger.duplicated,
        "mismatched_sessions": ledger.mismatched_sessions,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--verifier", required=True, help="host:port")
    p.add_argument("--token", default=None)
    p.add_argument("--tls-ca", default=None)
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--draft", default="default-draft")
    p.add_argument("--quantize", default="w4a16", choices=["w4a16", "w8a16", "none"])
    add_draft_flags(p, mode="pipelined")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--resume-timeout-s", type=float, default=0.0)
    p.add_argument("--json", default=None, help="also write the summary here")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        channel_target(args.verifier)  # a malformed address, a port outside [1, 65535]
    except ValueError as e:
        parser.error(str(e))
    summary = asyncio.run(run_load(args))
    for k, v in summary.items():
        print(f"{k:>22}: {v}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    bad = summary["lost_tokens"] + summary["duplicated_tokens"] + summary["mismatched_sessions"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
