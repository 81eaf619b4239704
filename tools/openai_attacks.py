"""Issue 48's attacks on a running OpenAI endpoint (`python -m edge serve`), with numbers.

    python tools/openai_attacks.py --url http://127.0.0.1:8000/v1 --key KEY \
        --verifier 127.0.0.1:50051 disconnect --clients 20 --max-tokens 200

Attacks: `disconnect` (clients gone mid-answer: the verifier's live sessions after
0.25/0.5/1/2/5 s), `burst` (bursts of concurrent requests past the verifier's slots, half
the clients gone at a random moment: sessions left after), `stall` (10 MB and context-
overflowing prompts while a neighbour streams: their statuses, the neighbour's longest gap
between chunks), `idle` (idle connections, then a request: its time, how many idle ones the
server closed, how many are still open after the head deadline), `reconnect` (the verifier
killed by the caller: run it, restart the verifier, see the time to the first success).
Timings are wall-clock on whatever machine runs it: say which.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import resource
import socket
import time
import urllib.parse

from edge.client import GrpcEndpoint


async def _stats(address: str) -> dict:
    async with GrpcEndpoint(address, timeout_s=30) as ep:
        return await ep.stats()


async def _post(
    url: str, key: str, body: dict
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    data = json.dumps(body).encode()
    head = (f"POST {u.path}/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n")  # fmt: skip
    writer.write(head.encode() + data)
    return reader, writer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


async def disconnect(a: argparse.Namespace) -> None:
    """Clients that go away once their answer has begun (streamed: its first chunk; whole:
    once the verifier has committed tokens)."""
    async with GrpcEndpoint(a.verifier, timeout_s=30) as ep:
        before = (await ep.stats())["tokens_committed"]
        begun = asyncio.Event()

        async def one(i: int) -> None:
            body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "seed": i,
                    "stream": i % 2 == 0}  # fmt: skip
            reader, writer = await _post(a.url, a.key, body)
            while i % 2 == 0 and (line := await reader.readline()):
                if line.startswith(b"data: {"):
                    begun.set()
                    break
            await begun.wait()
            writer.transport.abort()

        async def watch() -> None:
            while (await ep.stats())["tokens_committed"] <= before:
                await asyncio.sleep(0.05)
            begun.set()

        await asyncio.gather(watch(), *(one(i) for i in range(a.clients)))
        t0, live = time.monotonic(), []
        for t in (0.25, 0.5, 1.0, 2.0, 5.0):
            await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
            live.append(f"{t:g} s: {(await ep.stats())['sessions']}")
    print(f"{a.clients} clients gone mid-answer; live sessions at " + ", ".join(live))


async def burst(a: argparse.Namespace) -> None:
    """Bursts of `clients` requests at once, every other client gone at a random moment."""
    rng, statuses = random.Random(0), {}

    async def one(i: int) -> None:
        reader, writer = await _post(
            a.url, a.key, {"prompt": a.prompt, "max_tokens": 30, "seed": i}
        )
        if i % 2:
            await asyncio.sleep(rng.uniform(0, 1.0))
            writer.transport.abort()
            return
        status = _status(await reader.read())
        statuses[status] = statuses.get(status, 0) + 1

    for b in range(a.bursts):
        await asyncio.gather(*(one(b * a.clients + i) for i in range(a.clients)))
    deadline = time.monotonic() + 10
    while (left := (await _stats(a.verifier))["sessions"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    print(
        f"{a.bursts} bursts of {a.clients}: statuses {statuses}; sessions left after 10 s: {left}"
    )


async def _neighbour(a: argparse.Namespace, attacks: list[str]) -> tuple[float, list[str]]:
    """A neighbour's stream, `attacks` sent while it runs: its longest gap between chunks,
    and each attack's status and time."""
    body = {"prompt": a.prompt, "max_tokens": a.max_tokens, "seed": 1, "stream": True}
    reader, _ = await _post(a.url, a.key, body)
    times: list[float] = []

    async def read() -> None:
        while (line := await reader.readline()) and b"[DONE]" not in line:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())

    async def attack(prompt: str) -> str:
        t0 = time.monotonic()
        r, _ = await _post(a.url, a.key, {"prompt": prompt, "max_tokens": 4})
        answer = await r.read()
        return f"{len(prompt) >> 10} KiB prompt: {_status(answer)} in {time.monotonic() - t0:.2f} s"

    watch = asyncio.ensure_future(read())
    while not times and not watch.done():
        await asyncio.sleep(0.01)
    done = [await attack(p) for p in attacks]
    await watch
    return max((y - x for x, y in itertools.pairwise(times)), default=0.0), done


async def stall(a: argparse.Namespace) -> None:
    """Huge prompts while a neighbour streams: their statuses, and the neighbour's longest
    gap between chunks with them and alone (the same stream: nothing left to compile)."""
    await _neighbour(a, [])  # its shapes compiled
    alone, _ = await _neighbour(a, [])
    huge = ["x" * (10 << 20), "x " * 400_000, "word " * 20_000] * 3
    attacked, done = await _neighbour(a, huge)
    print("; ".join(done[:3]) + f"; the neighbour's longest gap between chunks: "
          f"{attacked:.3f} s under {len(huge)} such requests, {alone:.3f} s alone")  # fmt: skip


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (an EOF or a reset; no data waiting means open)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def idle(a: argparse.Namespace) -> None:
    """`clients` idle connections, a request among them, then the head deadline."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, a.clients + 500)), hard))
    u = urllib.parse.urlsplit(a.url)
    socks = [socket.create_connection((u.hostname, u.port), timeout=30) for _ in range(a.clients)]
    t0 = time.monotonic()
    reader, _ = await _post(a.url, a.key, {"prompt": a.prompt, "max_tokens": 4})
    status = _status(await reader.read())
    took = time.monotonic() - t0

    def closed() -> int:
        return sum(map(_closed_by_peer, socks))

    first = closed()
    await asyncio.sleep(a.wait_s)
    left = a.clients - closed()
    print(f"{a.clients} idle connections: a request answered {status} in {took:.2f} s, "
          f"{first} idle ones closed by then, {left} open after {a.wait_s:g} s")  # fmt: skip
    for s in socks:
        s.close()


async def reconnect(a: argparse.Namespace) -> None:
    """Requests every 0.1 s until one succeeds twice in a row: the first success's time."""
    t0 = time.monotonic()
    while True:
        reader, _ = await _post(a.url, a.key, {"prompt": a.prompt, "max_tokens": 2})
        if _status(await reader.read()) == 200:
            print(f"first success {time.monotonic() - t0:.2f} s after the first try, at "
                  f"{time.time():.2f} (epoch s)")  # fmt: skip
            return
        await asyncio.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--key", default="-")
    p.add_argument("--verifier", default=None, help="host:port, for its Stats")
    p.add_argument("--prompt", default="def fib(n):")
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--wait-s", type=float, default=12.0)
    p.add_argument("attack", choices=["disconnect", "burst", "stall", "idle", "reconnect"])
    a = p.parse_args()
    asyncio.run(globals()[a.attack](a))


if __name__ == "__main__":
    main()
