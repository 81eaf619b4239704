"""Concurrency cells against an OpenAI endpoint, as load tools measure servers.

    python tools/serve_load.py --concurrency 1 4 --requests 8 -- jaxspec serve --gamma 0

Starts the command after `--` (a `jaxspec serve` or `python -m edge serve` line; `--port` is
added), waits for its ready line, sends one warm-up round at each concurrency, then for each
concurrency `--requests` streamed chat requests with `ignore_eos` (every answer exactly
`--tokens` tokens), at most that many in flight. Per cell: output tokens/s (all tokens over
the cell's wall time), requests/s, TTFT and inter-token latency (a chunk's tokens spread over
its gap) mean and p99, errors. Prints one JSON line per cell (`--json FILE` keeps them all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import time
from typing import Any

import openai

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from soak import HTTP_READY, Proc, free_port, p99

QUESTION = (
    "Explain, step by step and in plain words, how a lighthouse keeper in the nineteenth "
    "century kept the lamp burning through a long winter night: the fuel, the wick, the "
    "lens, the clockwork that turned it, what could go wrong and what the keeper did then. "
)


async def one(client: openai.AsyncOpenAI, model: str, tokens: int, seed: int) -> dict[str, Any]:
    """One streamed chat request: its TTFT, its gaps per token and its tokens."""
    t0 = time.perf_counter()
    first, last, itl, n = None, None, [], 0
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION * 2}], max_tokens=tokens,
        temperature=0.7, seed=seed, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = now
            elif last is not None:
                itl.append(now - last)
            last = now
        if chunk.usage is not None:
            n = chunk.usage.completion_tokens
    gaps = [g / max(1, (n - 1) / max(1, len(itl) + 1)) for g in itl]  # per-token gaps
    return {"ttft": (first or time.perf_counter()) - t0, "itl": gaps, "tokens": n}


async def cell(
    client: openai.AsyncOpenAI, model: str, c: int, requests: int, tokens: int, seed0: int
) -> dict[str, Any]:
    """`requests` requests, at most `c` at once."""
    sem = asyncio.Semaphore(c)
    errors: list[str] = []

    async def run(i: int) -> dict[str, Any] | None:
        async with sem:
            try:
                return await one(client, model, tokens, seed0 + i)
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


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    command = list(args.command)
    if command and command[0] == "jaxspec":
        command = ["-m", "jaxspec_apps.cli", *command[1:]]
    elif command and command[0] in ("python", "python3", sys.executable):
        command = command[1:]
    port = free_port()
    t0 = time.monotonic()
    server = Proc("server", [*command, "--port", str(port)])
    try:
        m = await server.wait_for(HTTP_READY, args.start_timeout_s)
        ready_s = time.monotonic() - t0
        client = openai.AsyncOpenAI(base_url=m.group(1), api_key="x", max_retries=0, timeout=600)
        model = (await client.models.list()).data[0].id
        rows = []
        for c in args.concurrency:
            if args.warmup:
                await cell(client, model, c, c, args.tokens, 10_000)
            row = await cell(client, model, c, args.requests, args.tokens, 0)
            row |= {"ready_s": round(ready_s, 1), "rss_mb": server.figures()["rss_mb"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
        return rows
    finally:
        await server.terminate()
        if args.verbose:
            print("".join(server.lines[-20:]), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=120)
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--start-timeout-s", type=float, default=900)
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--verbose", action="store_true")
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
