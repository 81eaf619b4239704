"""Concurrency cells against an OpenAI endpoint, as load tools measure servers.

    python tools/serve_load.py --concurrency 1 4 --requests 8 -- jaxspec serve --gamma 0
    python tools/serve_load.py -- llama-server -m model.gguf -t 2 -np 8 -c 4096

Starts the command after `--` (`jaxspec serve`, `python -m edge serve`, `llama-server`, any
server with `--port`, `GET /health` and the OpenAI routes; `--port` is added), waits until
its `/health` answers 200, sends one warm-up round at each concurrency, then for each
concurrency `--requests` streamed chat requests with `ignore_eos` (every answer exactly
`--tokens` tokens), at most that many in flight. Per cell: output tokens/s (all tokens over
the cell's wall time; the usage's count, else one token a chunk), requests/s, TTFT and
inter-token latency (a chunk's tokens spread over its gap) mean and p99, errors, the server's
resident memory and its start-up to ready. Prints one JSON line per cell (`--json FILE`
keeps them all). The tool shares the machine with the server: on 2 cores it takes part of
one (say so beside its figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import openai

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from soak import free_port, p99

QUESTION = (
    "Explain, step by step and in plain words, how a lighthouse keeper in the nineteenth "
    "century kept the lamp burning through a long winter night: the fuel, the wick, the "
    "lens, the clockwork that turned it, what could go wrong and what the keeper did then. "
)


async def one(
    client: openai.AsyncOpenAI, model: str, tokens: int, seed: int, chat: bool = True
) -> dict[str, Any]:
    """One streamed request (chat, else a completion of the same text): its TTFT, its gaps
    per token and its tokens."""
    t0 = time.perf_counter()
    first, last, itl, n = None, None, [], 0
    kw = dict(
        model=model, max_tokens=tokens, temperature=0.7, seed=seed, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    words = (QUESTION * 2).split()
    k = seed % len(words)  # every request its own words from the first on: no server reuses
    text = f"Question {seed}: " + " ".join(words[k:] + words[:k])  # a cached prompt prefix
    if chat:
        messages = [{"role": "user", "content": text}]
        stream = await client.chat.completions.create(messages=messages, **kw)
    else:
        stream = await client.completions.create(prompt=text, **kw)
    chunks = 0
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and _text(chunk.choices[0]):
            chunks += 1
            if first is None:
                first = now
            elif last is not None:
                itl.append(now - last)
            last = now
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    n = n or chunks
    gaps = [g / max(1, (n - 1) / max(1, len(itl) + 1)) for g in itl]  # per-token gaps
    return {"ttft": (first or time.perf_counter()) - t0, "itl": gaps, "tokens": n}


def _text(choice: Any) -> str | None:
    """A chunk's text, chat or completion."""
    delta = getattr(choice, "delta", None)
    return delta.content if delta is not None else choice.text


async def cell(
    client: openai.AsyncOpenAI, model: str, c: int, requests: int, tokens: int, seed0: int,
    chat: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """`requests` requests, at most `c` at once."""
    sem = asyncio.Semaphore(c)
    errors: list[str] = []

    async def run(i: int) -> dict[str, Any] | None:
        async with sem:
            try:
                return await one(client, model, tokens, seed0 + i, chat)
            except openai.APIError as e:
                errors.append(f"{type(e).__name__}: {e}"[:120])
                return None

    t0 = time.perf_counter()
    done = [r for r in await asyncio.gather(*(run(i) for i in range(requests))) if r]
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in done]
    itl = [g for r in done for g in r["itl"]]
    out_tokens = sum(r["tokens"] for r in done)
    return {
        "concurrency": c,
        "requests": len(done),
        "errors": errors,
        "output_tokens": out_tokens,
        "tokens_per_s": round(out_tokens / wall, 2),
        "requests_per_s": round(len(done) / wall, 3),
        "ttft_mean_ms": round(1000 * statistics.fmean(ttft), 1) if ttft else None,
        "ttft_p99_ms": round(1000 * p99(ttft), 1) if ttft else None,
        "ttft_max_ms": round(1000 * max(ttft), 1) if ttft else None,
        "ttft_median_ms": round(1000 * statistics.median(ttft), 1) if ttft else None,
        "itl_mean_ms": round(1000 * statistics.fmean(itl), 2) if itl else None,
        "itl_p99_ms": round(1000 * p99(itl), 2) if itl else None,
        "wall_s": round(wall, 2),
    }


def _start(command: list[str], port: int) -> subprocess.Popen:
    """The server's process (its own group), `jaxspec`/`python` run by this interpreter."""
    if command[0] == "jaxspec":
        command = [sys.executable, "-m", "jaxspec_apps.cli", *command[1:]]
    elif command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    log = tempfile.TemporaryFile("w+")  # read back if it dies (a pipe left unread blocks it)
    proc = subprocess.Popen(
        [*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    proc.log = log
    return proc


async def _ready(proc: subprocess.Popen, port: int, timeout: float) -> None:
    """Until `GET /health` answers 200 (the process's last words if it dies first)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if proc.poll() is not None:
            proc.log.seek(0)
            raise RuntimeError(f"the server exited {proc.returncode}: {proc.log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.25)
    raise RuntimeError(f"the server was not ready in {timeout:g} s")


def _rss_mb(pid: int) -> int:
    with contextlib.suppress(OSError, AttributeError):
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) // 1024
    return 0


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    port = free_port()
    t0 = time.monotonic()
    proc = _start(list(args.command), port)
    try:
        await _ready(proc, port, args.start_timeout_s)
        ready_s = time.monotonic() - t0
        url = f"http://127.0.0.1:{port}/v1"
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
        model = (await client.models.list()).data[0].id
        rows = []
        for c in args.concurrency:
            if args.warmup:
                await cell(client, model, c, c, args.tokens, 100_000 + 1000 * c, args.chat)
            # seeds (and prompts) of its own: a server's prompt cache never holds them
            row = await cell(client, model, c, args.requests, args.tokens, 1000 * c, args.chat)
            row |= {"ready_s": round(ready_s, 1), "rss_mb": _rss_mb(proc.pid)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        return rows
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=120)
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument(
        "--completions",
        dest="chat",
        action="store_false",
        help="/v1/completions of the same text (a model without a chat template)",
    )
    p.add_argument("--start-timeout-s", type=float, default=900)
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("give the server's command after --")
    rows = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
