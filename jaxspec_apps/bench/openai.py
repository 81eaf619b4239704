"""The `openai` section (run only when named: `jaxspec bench --pairs tiny --sections openai`):
the OpenAI-compatible endpoint's cost, measured in one run against one verifier.

1. Per-token overhead over `edge generate`: the same greedy request (same prompt, tokens and
   flags) as an edge session run in this process over gRPC, as `python -m edge generate`
   runs it, and through `python -m edge serve` (a subprocess, streamed over HTTP/SSE and
   read to `[DONE]`); time per token = a request's wall time / its tokens;
   `openai_repeats` pairs run back to back after a warm-up, the overhead their ratios'
   median. The goal is <= 5% overhead.
2. `openai_clients` concurrent streaming clients (seeds 0..N-1, temperature 1) on that one
   verifier: aggregate tokens/s against one client alone, and the time to the first chunk.

The verifier serves the tiny pair's target, the endpoint drafts with its draft at W4A16.
Both servers run with --no-warmup; every shape is compiled by the warm-up requests before any
timing. It prints the two result lines.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edge.client import GrpcEndpoint
from edge.drafter import load_drafter
from edge.session import run_session
from jaxspec.nn.text import decode_text, encode_prompt
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.section import Context, Section, sizes
from verify.process import VerifierProcess

# This section's sizes (the endpoint against edge sessions).
Config = sizes("openai_", new_tokens=64, clients=8, repeats=7)


QUICK_SIZES = Config(new_tokens=16, clients=2, repeats=1)

PROMPT = "def fib(n):"
READY = re.compile(r"jaxspec OpenAI endpoint serving \S+ on (http://\S+/v1)")


def _start_endpoint(verifier: str, draft: str, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`python -m edge serve` on a free port; (process, base URL) once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge", "serve", "--verifier", verifier, "--draft", draft,
         "--port", "0", "--timeout-s", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            m = READY.search(line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(300)
    if not found:
        proc.kill()
        raise RuntimeError("python -m edge serve did not start")
    return proc, found[0]


def stream_request(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed /v1/completions request read to `[DONE]`: its text, usage, wall time
    and time to the first text chunk."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request(
        "POST", u.path + "/completions", json.dumps(payload), {"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:500]!r}")
    text, first, use = [], None, None
    for line in r:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        msg = json.loads(data)
        if msg.get("usage"):
            use = msg["usage"]
        for c in msg.get("choices", []):
            if c["text"] and first is None:
                first = time.perf_counter() - t0
            text.append(c["text"])
    wall = time.perf_counter() - t0
    conn.close()
    return {"text": "".join(text), "usage": use, "wall_s": wall, "first_s": first}


async def _pairs(
    address: str, url: str, pid: int, drafter: Any, config: SessionConfig, repeats: int
) -> tuple[list[float], list[float], list]:
    """`repeats` + 1 back-to-back pairs (the first a warm-up): the session as `python -m edge
    generate` runs it, over one kept channel (as the endpoint keeps one), then the same
    request through the endpoint (process `pid`). Lists of seconds per token (edge,
    endpoint), and the CPU seconds each side's process spent over all pairs and their
    tokens: the session in this process, the endpoint's server process (HTTP included)."""
    body = {"prompt": PROMPT, "max_tokens": config.max_new_tokens, "temperature": 0}
    edge_runs, api_runs, cpu = [], [], [0.0, 0.0, 0]  # cpu: edge s, endpoint s, tokens
    async with GrpcEndpoint(address, timeout_s=300) as ep:
        for i in range(repeats + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            trace = await run_session(ep, drafter, config, depth=2)
            wall, edge_cpu = time.perf_counter() - t0, time.process_time() - c0
            c0 = _cpu_s(pid)
            got = await asyncio.to_thread(stream_request, url, body)
            api_cpu = _cpu_s(pid) - c0
            if got["text"] != decode_text(drafter.model, trace.tokens):
                raise RuntimeError("the endpoint's text differs from the edge session's")
            if i:
                edge_runs.append(wall / len(trace.tokens))
                api_runs.append(got["wall_s"] / got["usage"]["completion_tokens"])
                cpu = [cpu[0] + edge_cpu, cpu[1] + api_cpu, cpu[2] + len(trace.tokens)]
    return edge_runs, api_runs, cpu


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overhead(address: str, url: str, pid: int, n: int, repeats: int, draft: str) -> dict[str, Any]:
    """Time per token of the same greedy request, edge session vs the endpoint."""
    spec = DraftSpec(gamma=4)
    drafter = load_drafter(draft, "w4a16", spec)
    ids = encode_prompt(drafter.model, PROMPT)
    config = SessionConfig(prompt=ids, max_new_tokens=n, mode="pipelined", draft=spec,
                           sampling=SamplingSettings(temperature=0.0))  # fmt: skip
    edge_runs, api_runs, cpu = asyncio.run(_pairs(address, url, pid, drafter, config, repeats))
    # Each pair ran back to back (the same load on the shared cores): the median of the
    # pairs' ratios is the overhead; the best times are shown beside it.
    ratios = [a / e for a, e in zip(api_runs, edge_runs, strict=True)]
    return {"tokens": n, "edge_ms": min(edge_runs) * 1e3,
            "api_ms": min(api_runs) * 1e3, "overhead": statistics.median(ratios) - 1,
            "ratios": ratios, "edge_cpu_ms": cpu[0] / cpu[2] * 1e3,
            "api_cpu_ms": cpu[1] / cpu[2] * 1e3}  # fmt: skip


async def _sessions(address: str) -> int:
    async with GrpcEndpoint(address, timeout_s=30) as ep:
        return (await ep.stats())["sessions"]


def _idle(address: str) -> None:
    """Wait until the verifier holds no session: a closed stream frees its slot a moment
    after the client saw `[DONE]`, and a full verifier answers 429."""
    deadline = time.monotonic() + 60
    while asyncio.run(_sessions(address)) and time.monotonic() < deadline:
        time.sleep(0.05)


def concurrent(address: str, url: str, n: int, clients: int) -> dict[str, Any]:
    """`clients` streams at once (seeds 0..clients-1) against one alone (seed 0)."""
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 1.0}
    stream_request(url, {**body, "seed": 0})  # warm-up
    alone = stream_request(url, {**body, "seed": 0})
    one_tps = alone["usage"]["completion_tokens"] / alone["wall_s"]
    with ThreadPoolExecutor(clients) as pool:
        for _ in range(2):  # the first round compiles the verifier's larger row buckets
            _idle(address)
            t0 = time.perf_counter()
            runs = list(pool.map(lambda s: stream_request(url, {**body, "seed": s}),
                                 range(clients)))  # fmt: skip
            wall = time.perf_counter() - t0
    if runs[0]["text"] != alone["text"]:
        raise RuntimeError("seed 0's text changed when it ran with others")
    total = sum(r["usage"]["completion_tokens"] for r in runs)
    return {"clients": clients, "total_tokens": total, "wall_s": wall,
            "aggregate_tps": total / wall, "one_tps": one_tps,
            "first_p50_s": statistics.median(r["first_s"] for r in runs),
            "first_alone_s": alone["first_s"]}  # fmt: skip


def run_section(ctx: Context) -> dict[str, Any]:
    """One verifier and one endpoint on loopback; the overhead and the concurrent clients."""
    p = ctx.p
    n, clients = p.openai.new_tokens, p.openai.clients
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    max_len = str(max(128, 64 * -(-(n + 32) // 64)))
    flags = ["--checkpoint", ctx.target_name, "--max-sessions", str(max(8, clients)),
             "--max-gamma", "4", "--max-len", max_len, "--no-warmup"]  # fmt: skip
    load_before = os.getloadavg()[0]
    with VerifierProcess(flags, env=env) as verifier:
        verifier.wait_ready(300)
        proc, url = _start_endpoint(verifier.address, ctx.draft_name, env)
        try:
            o = overhead(verifier.address, url, proc.pid, n, p.openai.repeats, ctx.draft_name)
            c = concurrent(verifier.address, url, n, clients)
        finally:
            proc.terminate()
            proc.wait(30)
    return {"command": ctx.command, "cpus": os.cpu_count(), "repeats": p.openai.repeats,
            "load_before": load_before, "load_after": os.getloadavg()[0], "overhead": o,
            "concurrent": c}  # fmt: skip


SECTION = Section("openai", run_section)
