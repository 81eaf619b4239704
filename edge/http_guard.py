"""The OpenAI endpoint's HTTP side, hardened: uvicorn's h11 protocol with the endpoint's own
bounds (`HttpLimits`, from `--max-body-bytes --max-connections --header-timeout-s
--body-timeout-s --keep-alive-s`), and what the app checks of a request before any work
(`read_body`, `check_bearer`).

A request's head must arrive within `header_timeout_s` (`GuardedH11Protocol`: uvicorn keeps a
silent connection open forever) and within `max_header_bytes` (431); its body within
`body_timeout_s` and `max_body_bytes` (408, 413); at most `max_connections` are open (the
longest idle closed to make room, 503 when none is idle); a closing connection lingers
(`LingeringTransport`); every refusal at this layer is OpenAI's error shape. `serve_app` runs
an app under it until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge.openai_api import ApiError
from jaxspec_host.flags import HttpLimits

FD_RESERVE = 128  # files kept for what is not a client connection (models, gRPC, logs)
# uvicorn's backlog: the kernel's queue of connections not yet accepted, and how many asyncio
# accepts at one wake-up, before any of them is seen (uvicorn's 2,048 ran a 1,024-file
# process out of files mid-batch: accepting then stopped for a second at a time). The cap on
# open connections leaves room for two batches in flight.
ACCEPT_BATCH = 128
LINGER_S = 2.0  # a closing connection reads (and drops) what the client still sends this long


class LingeringTransport:
    """A connection's transport whose `close()` lingers: it sends what is buffered, ends our
    side (`write_eof`), then drops what the client still sends until it closes or `LINGER_S`
    passes. A plain close with the request's body unread (a 413 answered from the
    Content-Length alone) resets the connection, and a client still sending can lose the
    answer and retry. Everything else is the transport's own."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport, self.loop = transport, loop
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self.transport.is_closing()

    def close_now(self) -> None:
        """Close without lingering (nothing of the client's is left to read)."""
        self.lingering = True
        self.transport.close()

    def close(self) -> None:
        if self.is_closing():
            return
        self.lingering = True
        try:
            self.transport.write_eof()
            self.transport.resume_reading()
        except (NotImplementedError, RuntimeError, OSError):  # TLS has no half-close
            self.transport.close()
            return
        self.loop.call_later(LINGER_S, self.transport.close)


def raw_error(status: int, e: ApiError) -> bytes:
    """A whole HTTP/1.1 answer (the connection then closes) for the protocol layer, which
    answers before or outside any request h11 could pair it with."""
    body = json.dumps(e.body()).encode()
    reason = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
              503: b"Service Unavailable"}  # fmt: skip
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason[status])
    return head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


_HEAD_END = re.compile(rb"\n\r?\n")  # the blank line that ends a head (h11 takes bare \n too)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol (one per connection) with the endpoint's bounds (`limits`): a
    request's head must arrive within `header_timeout_s` of the connection opening or of the
    previous answer (uvicorn alone keeps a silent or byte-a-minute connection open forever);
    past `max_open` connections the one idle longest is closed (503 for the new one when
    none is idle); a malformed request is answered in OpenAI's error shape; a connection
    closes lingering (`LingeringTransport`)."""

    limits = HttpLimits()
    max_open = HttpLimits().max_connections

    def connection_made(self, transport: Any) -> None:
        super().connection_made(LingeringTransport(transport, self.loop))
        self.idle_since = self.loop.time()
        self.head_deadline: asyncio.TimerHandle | None = None
        self._await_head()
        if len(self.connections) > self.max_open:
            self._make_room()

    def waiting(self) -> bool:
        """Whether the connection waits for a request (none, or part of one's head)."""
        answering = self.cycle is not None and not self.cycle.response_complete
        return self.conn.their_state is h11.IDLE and not answering

    def _make_room(self) -> None:
        open_ = [p for p in self.connections if not p.transport.is_closing()]
        if len(open_) <= self.max_open:
            return
        idle = [p for p in open_ if p is not self and getattr(p, "waiting", bool)()]
        if idle:
            min(idle, key=lambda p: p.idle_since).transport.close_now()
            return
        why = f"the endpoint is at its limit of {self.max_open} connections, none idle"
        err = ApiError(why, status=503, type="service_unavailable", code="too_many_connections")
        self.transport.write(raw_error(503, err))
        self.transport.close()

    def _await_head(self) -> None:
        self._cancel_deadline()
        self.head_deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _cancel_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _head_late(self) -> None:
        """The head did not come in time: close (with a 408 if part of it came)."""
        self.head_deadline = None
        if self.transport.is_closing() or not self.waiting():
            return
        if not self.conn.trailing_data[0]:
            self.transport.close_now()  # nothing came: an idle connection
            return
        why = f"the request's head did not arrive within {self.limits.header_timeout_s:g} s"
        self.transport.write(raw_error(408, ApiError(why, status=408, code="request_timeout")))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            return  # closing: what the client still sends is dropped
        if self.waiting() and self._head_too_long(data):
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_deadline()  # the head is in: the body has the app's deadline

    def _head_too_long(self, data: bytes) -> bool:
        """Answer 431 and close when the head being received (what h11 holds of it and
        `data`) is over `max_header_bytes`: h11 bounds only a head that is still incomplete,
        so one that came whole in a single read passed at any size."""
        held = bytes(self.conn.trailing_data[0])
        limit = self.limits.max_header_bytes
        if len(held) + len(data) <= limit or _HEAD_END.search(held + data, 0, limit):
            return False  # whole within the limit, or ends within it
        why = f"the request's head is over {limit} bytes (request line and headers)"
        err = ApiError(why, status=431, code="request_header_fields_too_large")
        self.transport.write(raw_error(431, err))
        self.transport.close()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.idle_since = self.loop.time()
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        why = (
            "invalid HTTP request: malformed, or a head over "
            f"{self.limits.max_header_bytes} bytes ({msg})"
        )
        body = json.dumps(ApiError(why, code="invalid_http").body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        try:
            out = self.conn.send(
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            )
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
        except h11.LocalProtocolError:
            pass  # an answer had begun: closing is all that is left
        self.transport.close()


def open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (a common soft
    default, 1,024, is a few idle connections' worth) and return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def http_server(app: FastAPI, host: str, port: int, limits: HttpLimits) -> uvicorn.Server:
    """uvicorn serving `app` with `limits` (`GuardedH11Protocol`); `max_connections` is
    lowered to what the file limit leaves, `FD_RESERVE` files kept, and a line says so."""
    files = open_files_limit()
    max_open = max(16, min(limits.max_connections, files - FD_RESERVE - 2 * ACCEPT_BATCH))
    if max_open < limits.max_connections:
        print(
            f"the OpenAI endpoint: at most {max_open} connections (the process may open {files} "
            f"files; --max-connections {limits.max_connections})",
            file=sys.stderr,
            flush=True,
        )
    protocol = type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "max_open": max_open}
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=protocol,
        ws="none",
        backlog=ACCEPT_BATCH,
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )
    return uvicorn.Server(config)


def ready_line(model_id: str, host: str, port: int) -> str:
    """The line a server prints once it listens (tests and scripts wait for it)."""
    return f"jaxspec OpenAI endpoint serving {model_id} on http://{host}:{port}/v1"


async def serve_app(
    app: FastAPI, host: str, port: int, model_id: str, limits: HttpLimits | None = None
) -> None:
    """Run `app` under uvicorn (`http_server`) in this event loop until SIGINT/SIGTERM; print
    `ready_line` (with the port bound: `port` 0 picks a free one) once it listens."""
    server = http_server(app, host, port, limits or HttpLimits())

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1]
        print(ready_line(model_id, host, bound), file=sys.stderr, flush=True)

    told = asyncio.ensure_future(announce())
    asyncio.get_running_loop().set_exception_handler(quiet_out_of_files())
    try:
        await server.serve()
    finally:
        told.cancel()


def quiet_out_of_files(every_s: float = 10.0) -> Callable[[Any, dict], None]:
    """The event loop's exception handler, with asyncio's "socket.accept() out of system
    resource" (a traceback per failed accept, thousands under a connection flood) said at
    most once per `every_s`, with how many were dropped."""
    last, dropped = [float("-inf")], [0]

    def handle(loop: Any, context: dict) -> None:
        if "out of system resource" in str(context.get("message", "")):
            now = time.monotonic()
            if now - last[0] < every_s:
                dropped[0] += 1
                return
            last[0] = now
            context = {**context, "message": f"{context['message']} ({dropped[0]} dropped)"}
            context.pop("exception", None)  # the traceback says nothing more
            dropped[0] = 0
        loop.default_exception_handler(context)

    return handle


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The request's body: 413 past `max_body_bytes` (by its Content-Length, unread, or as
    it arrives), 408 when it has not all arrived within `body_timeout_s`."""
    limit = limits.max_body_bytes
    too_large = ApiError(
        f"the request body is over {limit} bytes (--max-body-bytes)",
        status=413,
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise too_large
    parts, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise too_large
                parts.append(part)
    except TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {limits.body_timeout_s:g} s",
            status=408,
            code="request_timeout",
        ) from None
    except ClientDisconnect:
        raise ApiError("the client went away before its body arrived") from None
    return b"".join(parts)


def check_bearer(request: Request, key: bytes | None) -> None:
    """401 unless the request carries exactly one `Authorization: Bearer <key>` (when a key
    is set; compared as bytes, so any header byte is just a wrong key)."""
    if key is None:
        return
    values = [v for k, v in request.scope["headers"] if k == b"authorization"]
    why = "missing or wrong API key (Authorization: Bearer <key>)"
    if len(values) > 1:
        why = f"{len(values)} Authorization headers (send exactly one)"
    scheme, _, token = (values[0] if values else b"").partition(b" ")
    if (
        len(values) != 1
        or scheme.lower() != b"bearer"
        or not hmac.compare_digest(token.strip(), key)
    ):
        raise ApiError(why, status=401, type="authentication_error", code="invalid_api_key")
