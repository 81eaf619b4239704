"""A soak: minutes of mixed load against a served model, watching for what grows and who stalls.

    python tools/soak.py --stack colocated --minutes 30          # jaxspec serve
    python tools/soak.py --stack split --minutes 30              # edge serve + verify serve
    python tools/soak.py --stack colocated --pair tiny --minutes 1 --quiet-s 10   # a quick look

Starts the servers itself (the real pair by default), waits until the verifier has compiled
every shape (its start-up is not what a soak measures), warms them, then measures a
well-behaved *neighbour* (one streamed request after another) beside two steady clients (one
streamed, one whole answers) for `--quiet-s`: its p99 inter-token latency (ITL) there is the
quiet value. Then, for `--minutes`, the attacks run beside them: clients that disconnect
mid-answer (every 10 s, four at once), bursts past the session limit (every minute,
`--max-sessions` + 4 requests at once), 10 MB bodies (every 30 s; the time to their 413),
slow readers (a stream read a line a second) and, with `--stack split`, a verifier restart
halfway (SIGTERM, its exit time, the same port again). Every minute it prints a row:
resident memory, open files and memory maps of each server process, live sessions, the
neighbour's p99 and longest ITL, what the attacks got. At the end every client leaves: the
time until no session is live, then SIGTERM and the time each server takes to exit.

Bounds it checks (exit 1 if one fails): no server's resident memory, files or maps growing
through the run (the last third's mean within 10% of the middle third's); live sessions 0
within 1 s of the last client leaving; the neighbour's p99 ITL within 2x its quiet value
each minute after the first (the first meets the shapes the warm-up did not compile, and a
verifier restart's minute is reported, not judged); SIGTERM within 5 s; no answer other than
those expected (a well-behaved client: 200, or 429 while the slots are full, at most 1% of
its requests; a burst or a leaver: 200 or 429; a 10 MB body: 413).
`--json FILE` keeps every row and the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from typing import Any

import openai

from jaxspec_host.xla_cache import memory_maps

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEY = "soak-key"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
HTTP_READY = re.compile(r"jaxspec OpenAI endpoint serving \S+ on (http://\S+/v1)")
GRPC_READY = re.compile(r"jaxspec verifier serving .* on \S+:(\d+)")
FULLY_WARM = re.compile(r"(fully warm|warmed up): \d+ shapes")  # nothing left to compile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server in its own process group, its output kept; `wait_for(pattern)` the first
    match of a line."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name, self.argv, self.lines = name, argv, []
        self.proc = subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.loop = asyncio.get_running_loop()
        self.matches: dict[re.Pattern, asyncio.Future] = {}
        self.loop.run_in_executor(None, self._read)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            for pattern, fut in list(self.matches.items()):
                m = pattern.search(line)
                if m and not fut.done():
                    self.loop.call_soon_threadsafe(fut.set_result, m)

    async def wait_for(self, pattern: re.Pattern, timeout: float) -> re.Match:
        fut = self.matches.setdefault(pattern, self.loop.create_future())
        for line in self.lines:
            if (m := pattern.search(line)) and not fut.done():
                fut.set_result(m)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            tail = "".join(self.lines[-40:])
            raise RuntimeError(f"{self.name} not ready in {timeout:g} s:\n{tail}") from None

    def figures(self) -> dict[str, int]:
        """Resident MB, open files and memory maps (Linux /proc)."""
        pid = self.proc.pid
        try:
            status = pathlib.Path(f"/proc/{pid}/status").read_text()
            rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) // 1024
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            maps = memory_maps(str(pid))[0]
        except (OSError, AttributeError, TypeError):  # gone, or no /proc (None)
            return {"rss_mb": 0, "fds": 0, "maps": 0}
        return {"rss_mb": rss, "fds": fds, "maps": maps}

    async def terminate(self, timeout: float = 60.0) -> float:
        """SIGTERM; seconds until it exited (killed past `timeout`)."""
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None and time.monotonic() - t0 < timeout:
            await asyncio.sleep(0.05)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return time.monotonic() - t0


@dataclasses.dataclass
class Minute:
    """What one minute of the soak saw."""

    itl: list[float] = dataclasses.field(default_factory=list)  # the neighbour's gaps
    statuses: Counter = dataclasses.field(default_factory=Counter)  # kind:status
    too_large_s: list[float] = dataclasses.field(default_factory=list)
    restart: bool = False


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: dict[str, Proc] = {}
        self.minute = Minute()
        self.url = ""
        self.grpc_port = 0
        self.running = True
        self.client: openai.AsyncOpenAI | None = None
        self.model = ""

    # -- servers ---------------------------------------------------------------------------

    async def start_verifier(self) -> None:
        a = self.args
        self.grpc_port = self.grpc_port or free_port()
        argv = ["-m", "verify", "serve", "--pair", a.pair, "--port", str(self.grpc_port),
                "--max-sessions", str(a.max_sessions)]  # fmt: skip
        self.procs["verify"] = Proc("verify serve", argv)
        await self.procs["verify"].wait_for(GRPC_READY, a.start_timeout_s)

    async def start(self) -> None:
        a = self.args
        port = str(free_port())
        if a.stack == "colocated":
            argv = ["-m", "jaxspec_apps.cli", "serve", "--pair", a.pair, "--port", port,
                    "--api-key", KEY, "--max-sessions", str(a.max_sessions)]  # fmt: skip
            self.procs["serve"] = Proc("jaxspec serve", argv)
        else:
            await self.start_verifier()
            argv = ["-m", "edge", "serve", "--pair", a.pair, "--port", port, "--api-key", KEY,
                    "--verifier", f"127.0.0.1:{self.grpc_port}",
                    "--resume-timeout-s", "120"]  # fmt: skip
            self.procs["edge"] = Proc("edge serve", argv)
        server = self.procs["serve" if a.stack == "colocated" else "edge"]
        self.url = (await server.wait_for(HTTP_READY, a.start_timeout_s)).group(1)
        if "verify" in self.procs:  # the soak measures the steady state, not the start-up:
            await self.procs["verify"].wait_for(FULLY_WARM, a.start_timeout_s)  # all shapes

    async def restart_verifier(self) -> float:
        self.minute.restart = True
        took = await self.procs["verify"].terminate()
        await self.start_verifier()
        return took

    # -- clients ---------------------------------------------------------------------------

    async def one(
        self, kind: str, stream: bool, tokens: int, seed: int,
        gaps: list[float] | None = None, read_every_s: float = 0.0,
    ) -> None:  # fmt: skip
        """One request through the openai SDK (no retries); its status counted under
        `kind`; a stream's gaps between chunks into `gaps`."""
        kw = dict(model=self.model, prompt=PROMPT, max_tokens=tokens, seed=seed, temperature=0.7)
        try:
            if stream:
                last = None
                async for chunk in await self.client.completions.create(**kw, stream=True):
                    if read_every_s:
                        await asyncio.sleep(read_every_s)
                    if gaps is not None and chunk.choices and chunk.choices[0].text:
                        now = time.monotonic()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
            else:
                await self.client.completions.create(**kw)
            status = "200"
        except openai.APIStatusError as e:
            status = str(e.status_code)
        except openai.APIError as e:
            status = type(e).__name__
        except Exception as e:
            status = f"{type(e).__name__}: {e}"[:80]
        self.minute.statuses[f"{kind}:{status}"] += 1

    async def raw(self, method: str, path: str, body: bytes = b"", length: int | None = None):
        """A raw HTTP/1.1 request for `path` (from the root) on a connection of its own:
        (reader, writer)."""
        u = urllib.parse.urlsplit(self.url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        n = len(body) if length is None else length
        head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
                f"\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n"
                "Connection: close\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + body)
        return reader, writer

    async def neighbour(self) -> None:
        seed = 0
        while self.running:
            seed += 1
            await self.one("neighbour", True, 64, seed, gaps=self.minute.itl)

    async def steady(self, stream: bool) -> None:
        seed = 10_000 if stream else 20_000
        while self.running:
            seed += 1
            await self.one("stream" if stream else "whole", stream, 48, seed)

    async def leave_midway(self, seed: int) -> None:
        """A streamed request abandoned at its first chunk (the socket reset)."""
        body = {"model": self.model, "prompt": PROMPT, "max_tokens": 100, "seed": seed,
                "stream": True}  # fmt: skip
        reader, writer = await self.raw("POST", "/v1/completions", json.dumps(body).encode())
        try:
            async with asyncio.timeout(60):
                status = (await reader.readline()).split(b" ")[1].decode()
                while status == "200":  # to its first chunk
                    line = await reader.readline()
                    if line.startswith(b"data: {") or not line:
                        status = "left" if line else "closed"
            self.minute.statuses[f"leave:{status}"] += 1
        except (TimeoutError, OSError, IndexError):
            self.minute.statuses["leave:no_first_chunk"] += 1
        writer.transport.abort()

    async def too_large(self) -> None:
        """A 10 MB body: the time to its 413 (answered from Content-Length)."""
        t0 = time.monotonic()
        reader, writer = await self.raw("POST", "/v1/completions", length=10 << 20)
        try:
            async with asyncio.timeout(60):
                writer.write(b'{"prompt": "' + b"x" * (10 << 20))
                line = await reader.readline()
            status = line.split(b" ")[1].decode() if line else "closed"
        except (TimeoutError, OSError, IndexError):
            status = "no_answer"
        self.minute.too_large_s.append(time.monotonic() - t0)
        self.minute.statuses[f"10MB:{status}"] += 1
        writer.transport.abort()

    async def attacks(self) -> None:
        """The mix, on a 10 s clock: leavers every 10 s, a 10 MB body every 30 s, a burst
        past the limit and a slow reader every minute, a verifier restart halfway (split)."""
        tick, seed = 0, 30_000
        halfway = self.args.minutes * 3  # in 10 s ticks
        background: set[asyncio.Task] = set()
        while self.running:
            seed += 100
            jobs = [self.leave_midway(seed + i) for i in range(4)]
            if tick % 3 == 0:
                jobs.append(self.too_large())
            if tick % 6 == 3:
                n = self.args.max_sessions + 4
                jobs += [self.one("burst", False, 4, seed + 10 + i) for i in range(n)]
            if tick % 6 == 0:  # a slow reader: its stream read a line a second, not awaited
                t = asyncio.ensure_future(self.one("slow", True, 32, seed + 50, read_every_s=1.0))
                background.add(t)
                t.add_done_callback(background.discard)
            if self.args.stack == "split" and tick == halfway:
                jobs.append(self.restart_and_note())
            await asyncio.gather(*jobs)
            tick += 1
            await asyncio.sleep(self.args.minute_s / 6)
        for t in background:
            t.cancel()

    async def restart_and_note(self) -> None:
        self.restart_exit_s = await self.restart_verifier()

    async def live_sessions(self) -> int:
        """Live sessions: the endpoint's, and the verifier's where it can say."""
        reader, writer = await self.raw("GET", "/health")
        answer = await reader.read()
        writer.close()
        h = json.loads(answer.partition(b"\r\n\r\n")[2])
        live = max(h.get("sessions", 0), h.get("verifier_sessions", 0))
        if "verify" in self.procs and self.grpc_port:
            live = max(live, await self.verifier_sessions())
        return live

    async def row(self, number: int, minute: Minute) -> dict[str, Any]:
        """The figures of one minute."""
        row: dict[str, Any] = {"minute": number, "live": await self.live_sessions()}
        for name, proc in self.procs.items():
            row |= {f"{name}_{k}": v for k, v in proc.figures().items()}
        return row | {
            "p99_itl_ms": round(p99(minute.itl) * 1e3, 1),
            "max_itl_ms": round(max(minute.itl, default=float("nan")) * 1e3, 1),
            "to_413_max_s": round(max(minute.too_large_s, default=0.0), 2),
            "restart": minute.restart,
            "statuses": dict(minute.statuses),
        }

    async def verifier_sessions(self) -> int:
        from edge.client import GrpcEndpoint

        try:
            async with GrpcEndpoint(f"127.0.0.1:{self.grpc_port}", timeout_s=10) as ep:
                return int((await ep.stats())["sessions"])
        except Exception:  # a verifier restarting: unknown, counted as none
            return 0


def p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    soak = Soak(args)
    rows: list[dict[str, Any]] = []
    try:
        t_start = time.monotonic()
        await soak.start()
        started_s = time.monotonic() - t_start
        soak.client = openai.AsyncOpenAI(base_url=soak.url, api_key=KEY, max_retries=0,
                                         timeout=180)  # fmt: skip
        soak.model = (await soak.client.models.list()).data[0].id
        for stream in (True, False):  # warm: the first of each compiles what it needs
            await soak.one("warm", stream, 16, 1)
        soak.minute = Minute()
        base = [asyncio.ensure_future(soak.neighbour()),
                asyncio.ensure_future(soak.steady(True)),
                asyncio.ensure_future(soak.steady(False))]  # fmt: skip
        await asyncio.sleep(args.quiet_s)
        quiet = soak.minute
        quiet_p99 = p99(quiet.itl)
        print(f"quiet ({args.quiet_s:g} s, the neighbour, a streamer, a whole-answer client): "
              "p99 ITL "
              f"{quiet_p99 * 1e3:.0f} ms over {len(quiet.itl)} gaps", flush=True)  # fmt: skip
        soak.minute = Minute()
        mix = [asyncio.ensure_future(soak.attacks())]
        for m in range(args.minutes):
            await asyncio.sleep(args.minute_s)
            minute, soak.minute = soak.minute, Minute()
            rows.append(await soak.row(m + 1, minute))
            print(json.dumps(rows[-1]), flush=True)
        soak.running = False
        t_left = time.monotonic()
        for t in [*base, *mix]:
            t.cancel()
        await asyncio.gather(*base, *mix, return_exceptions=True)
        while (live := await soak.live_sessions()) and time.monotonic() - t_left < 30:
            await asyncio.sleep(0.05)
        drain_s = time.monotonic() - t_left
        exits = {name: round(await p.terminate(), 2) for name, p in reversed(soak.procs.items())}
        restart_exit = getattr(soak, "restart_exit_s", None)
        return {
            "stack": args.stack, "pair": args.pair, "minutes": args.minutes,
            "max_sessions": args.max_sessions, "started_s": round(started_s, 1),
            "quiet_p99_itl_ms": round(quiet_p99 * 1e3, 1), "drain_s": round(drain_s, 3),
            "live_after": live, "sigterm_exit_s": exits,
            "restart_sigterm_exit_s": restart_exit and round(restart_exit, 2), "rows": rows,
        }  # fmt: skip
    finally:
        for p in soak.procs.values():
            if p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGKILL)


def _growth(rows: list[dict[str, Any]], key: str) -> float:
    """The last third's mean over the middle third's (1.0: flat)."""
    xs = [r[key] for r in rows]
    third = len(xs) // 3
    if third < 1:
        return 1.0
    middle, last = xs[third : 2 * third], xs[2 * third :]
    return statistics.fmean(last) / max(statistics.fmean(middle), 1e-9)


# What each kind of client may get: a burst past the limit and a leaver may find the slots
# full (429); a 10 MB body gets its 413; a well-behaved client gets its answer, always.
EXPECTED = {"burst": {"200", "429"}, "leave": {"left", "429"}, "10MB": {"413"}}


def judge(soak: dict[str, Any]) -> dict[str, Any]:
    """`soak` (what `run` measured) with the bounds of the module docstring judged, each with
    its figure. The first minute is reported, not judged for latency: it meets the shapes
    the warm-up did not compile (the mix's first bursts)."""
    rows = soak["rows"]
    growth = {
        k: round(_growth(rows, k), 3) for k in (rows[0] if rows else ())
        if k.endswith(("_rss_mb", "_fds", "_maps"))
    }  # fmt: skip
    judged = [r for r in rows[1:] if not r["restart"]]
    worst = max((r["p99_itl_ms"] for r in judged), default=0.0)
    odd, refused, asked = Counter(), 0, 0
    for r in rows:
        for kind, n in r["statuses"].items():
            who, status = kind.split(":", 1)
            well_behaved = who not in EXPECTED
            asked += n if well_behaved else 0
            if well_behaved and status == "429":  # the slots were full: counted, bounded
                refused += n
            elif status not in EXPECTED.get(who, {"200"}):
                odd[kind] += n
    checks = {
        "nothing grows (last third <= 1.10 x middle third)": all(
            g <= 1.10 for g in growth.values()
        ),
        "live sessions 0 within 1 s of the last client": soak["live_after"] == 0
        and soak["drain_s"] <= 1.0,
        "neighbour p99 ITL <= 2 x quiet each minute after the first": worst
        <= 2 * soak["quiet_p99_itl_ms"],
        "SIGTERM exit <= 5 s": all(s <= 5.0 for s in soak["sigterm_exit_s"].values()),
        "no unexpected answer": not odd,
        "well-behaved clients refused (429, slots full) <= 1%": refused <= 0.01 * max(asked, 1),
    }
    return soak | {
        "first_minute_p99_itl_ms": rows[0]["p99_itl_ms"] if rows else None,
        "worst_p99_itl_ms": worst, "growth": growth, "unexpected": dict(odd),
        "well_behaved_429": refused, "well_behaved_requests": asked, "checks": checks,
    }  # fmt: skip


def markdown(out: dict[str, Any], every: int = 5) -> str:
    """A judged soak as markdown: its figures, a row every `every` minutes (and the first
    and the last), its checks."""
    rows = out["rows"]
    procs = [k.removesuffix("_rss_mb") for k in rows[0] if k.endswith("_rss_mb")]
    head = ["minute", "live"] + [f"{p} {f}" for p in procs for f in ("RSS MB", "fds", "maps")]
    head += ["p99 ITL ms", "max ITL ms", "10 MB -> 413 s (max)", "well-behaved 429"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        if r["minute"] % every and r["minute"] not in (1, len(rows)) and not r["restart"]:
            continue
        cells = [str(r["minute"]) + (" (verifier restart)" if r["restart"] else ""), r["live"]]
        cells += [r[f"{p}_{f}"] for p in procs for f in ("rss_mb", "fds", "maps")]
        refused = sum(n for k, n in r["statuses"].items()
                      if k.endswith(":429") and k.split(":")[0] not in EXPECTED)  # fmt: skip
        cells += [r["p99_itl_ms"], r["max_itl_ms"], r["to_413_max_s"], refused]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    exits = ", ".join(f"{k} {v:g} s" for k, v in out["sigterm_exit_s"].items())
    restart = out.get("restart_sigterm_exit_s")
    restart = f" (the restart mid-run: {restart:g} s)" if restart else ""
    lines += [
        "",
        f"`{out['stack']}`, {out['pair']}, {out['minutes']} minutes, --max-sessions "
        f"{out['max_sessions']}: quiet p99 ITL {out['quiet_p99_itl_ms']:g} ms, worst minute "
        f"after the first {out['worst_p99_itl_ms']:g} ms (first {out['first_minute_p99_itl_ms']:g}"
        f"); growth (last third / middle third) "
        + ", ".join(f"{k} {v:g}" for k, v in out["growth"].items())
        + f"; no session live {out['drain_s']:g} s after the last client left; SIGTERM: {exits}"
        + restart
        + f"; well-behaved requests {out['well_behaved_requests']}, refused 429 "
        f"{out['well_behaved_429']}; unexpected answers {out['unexpected'] or 'none'}.",
        "",
    ]
    lines += [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in out["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stack", choices=("colocated", "split"), default="colocated")
    p.add_argument("--pair", default="smollm2", choices=("smollm2", "tiny"))
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--quiet-s", type=float, default=60.0)
    p.add_argument("--minute-s", type=float, default=60.0, help="a row's length (tests: less)")
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--start-timeout-s", type=float, default=900.0)
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--rejudge", type=pathlib.Path, help="judge a --json file again, no run")
    p.add_argument("--markdown", action="store_true", help="print a table, not JSON")
    args = p.parse_args(argv)
    out = judge(json.loads(args.rejudge.read_text()) if args.rejudge else asyncio.run(run(args)))
    summary = {k: v for k, v in out.items() if k != "rows"}
    print(markdown(out) if args.markdown else json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
