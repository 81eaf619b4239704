"""`GrpcEndpoint`: the edge's `VerifierEndpoint` over gRPC (`jaxspec.v1.Verifier`).

One channel per endpoint; one bidirectional Verify stream per session, opened on the first
block: blocks go up as they are drafted, results come back in order and resolve the
callers' futures. A failed stream fails every block in flight with the protocol error its
status maps to (UNAVAILABLE -> `Unavailable`, which `run_session` answers by resuming).

`check_verifier` is what a command asks first, before it loads or compiles anything: one
Stats call proves the verifier is reachable, takes the token and is serving.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import grpc

from jaxspec import wire
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import (
    ERRORS,
    DeadlineExceeded,
    DraftBlock,
    NotFound,
    PermissionDenied,
    SessionConfig,
    SessionInfo,
    Unauthenticated,
    Unavailable,
    VerifierError,
    VerifyResult,
)

# Words for the usual reasons a channel cannot reach a verifier (grpc's details are long).
_REASONS = (
    ("connection refused", "connection refused"),
    ("errors resolving", "name not resolved"),
    ("domain name not found", "name not resolved"),
    ("handshake", "TLS handshake failed"),
    ("ssl", "TLS error"),
    ("deadline", "no answer in time"),
    ("not serving", "not serving: warming up or draining"),
)


def error_from_rpc(e: grpc.RpcError) -> VerifierError:
    """The protocol error for a failed call (a server going away reads as Unavailable)."""
    code = e.code() if hasattr(e, "code") else None
    name = code.name if code is not None else "UNKNOWN"
    details = (e.details() if hasattr(e, "details") else None) or name
    if name == "CANCELLED":  # the server stopped under us (our own cancels never get here)
        name = "UNAVAILABLE"
    if name == "INTERNAL" and details == "Internal error from Core":
        # grpc.aio replaces the real status with this one when a write races the end of
        # the stream (grpc/grpc#36066): a server that died or ended the stream. Reopen.
        name = "UNAVAILABLE"
    cls = ERRORS.get(name)
    if cls is None:
        err = VerifierError(f"{name}: {details}")
        err.code = name
        return err
    return cls(details)


@dataclasses.dataclass
class _Stream:
    call: Any
    pending: collections.deque  # futures, in send order
    reader: asyncio.Task | None = None
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one write at a time


class GrpcEndpoint:
    """Connects to `target` ("host:port"); `token` is the tenant's bearer token; `tls_ca`
    (PEM bytes or a path) turns on TLS, trusting that CA (None with `tls=True`: system CAs).
    `timeout_s` is the deadline of each unary call and of each block's result."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        tls_ca: bytes | str | None = None,
        tls_server_name: str | None = None,
        timeout_s: float = 30.0,
        max_message_bytes: int = 64 << 20,
    ):
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls or tls_ca is not None:
            if isinstance(tls_ca, str):
                with open(tls_ca, "rb") as f:
                    tls_ca = f.read()
            creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self.channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.target = target
        self.stub = pb_grpc.VerifierStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s
        self._streams: dict[str, _Stream] = {}

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        reply = await self._unary(self.stub.OpenSession, wire.config_to_proto(config))
        return wire.info_from_proto(reply)

    async def verify(self, block: DraftBlock) -> VerifyResult:
        stream = self._streams.get(block.session_id)
        if stream is None:
            call = self.stub.Verify(metadata=self.metadata)
            stream = self._streams[block.session_id] = _Stream(call, collections.deque())
            stream.reader = asyncio.ensure_future(self._read(block.session_id, stream))
        fut: asyncio.Future[VerifyResult] = asyncio.get_running_loop().create_future()
        # A failed stream fails every pending block, also those whose callers have moved
        # on (a session that already raised): mark the error seen so asyncio stays quiet.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        message = wire.block_to_proto(block)
        async with stream.lock:  # grpc.aio allows one write in flight; FIFO keeps the order
            stream.pending.append(fut)
            try:
                await stream.call.write(message)
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass  # the reader sees the stream's status and fails `fut` with it
        try:  # not wait_for: on 3.11 it can return a result and drop a cancellation
            async with asyncio.timeout(self.timeout_s):
                return await fut
        except TimeoutError:
            raise DeadlineExceeded(f"no result within {self.timeout_s} s") from None

    async def _read(self, sid: str, stream: _Stream) -> None:
        error: VerifierError | None
        try:
            async for msg in stream.call:
                if stream.pending:
                    fut = stream.pending.popleft()
                    if not fut.done():  # a caller that timed out has cancelled it
                        fut.set_result(wire.result_from_proto(msg))
            error = Unavailable("the verifier ended the stream")
        except grpc.RpcError as e:
            error = error_from_rpc(e)
        except asyncio.CancelledError:
            error = None  # closed by us: whoever still waits is cancelled with it
        if self._streams.get(sid) is stream:
            del self._streams[sid]
        while stream.pending:
            fut = stream.pending.popleft()
            if fut.done():
                continue
            if error is None:
                fut.cancel()
            else:
                fut.set_exception(error)

    async def close_session(self, session_id: str) -> None:
        """Free the session's slot, then end its stream. A verifier that is gone has freed
        it already, so Unavailable/NotFound are not errors here."""
        try:
            await self._unary(self.stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))
        except (Unavailable, NotFound):
            pass
        await self._end_stream(session_id)

    async def _end_stream(self, session_id: str) -> None:
        """Cancel the session's stream; its reader cancels whoever still waits on it."""
        stream = self._streams.pop(session_id, None)
        if stream is not None:
            stream.call.cancel()
            if stream.reader is not None:
                await asyncio.gather(stream.reader, return_exceptions=True)

    async def stats(self) -> dict[str, Any]:
        """The verifier's scheduler figures (sessions, queue depth, step time, occupancy)."""
        m = await self._unary(self.stub.Stats, pb.StatsRequest())
        return {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}

    async def aclose(self) -> None:
        for sid in list(self._streams):
            await self._end_stream(sid)
        await self.channel.close()

    async def __aenter__(self) -> GrpcEndpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def short_reason(error: Exception) -> str:
    """A few words for why a call failed ("connection refused", "name not resolved", ...);
    the error's own text when none fits."""
    text = str(error)
    low = text.lower()
    return next((words for needle, words in _REASONS if needle in low), text)


def retry_notice(target: str, error: Exception, retry_s: float) -> str:
    """`verifier localhost:1 unavailable (connection refused); retrying until 12:03:04 (30 s)`:
    what a command prints when it starts retrying, so a wrong address is not a silent wait."""
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + retry_s))
    return (
        f"verifier {target} unavailable ({short_reason(error)}); "
        f"retrying until {until} ({retry_s:g} s)"
    )


async def check_verifier(
    endpoint: GrpcEndpoint,
    *,
    retry_s: float = 0.0,
    backoff_s: float = 0.5,
    on_retry: Callable[[str], None] | None = None,
    serving: bool = True,
) -> dict[str, Any]:
    """The verifier's Stats, asked before anything is loaded or compiled: one call proves it
    is reachable, accepts the endpoint's token (Stats is authenticated like every call) and
    (with `serving`) is serving: not warming up, not draining.

    An unavailable or not-serving verifier is retried every `backoff_s` for `retry_s` seconds
    (a restart takes a while); `on_retry(notice)` hears once that it is retrying, why, and
    until when (`retry_notice`). Raises the protocol error, its message naming the address:
    `Unavailable` ("verifier H:P unavailable (connection refused); gave up after 30 s"),
    `Unauthenticated` / `PermissionDenied` ("verifier H:P refused the token (...)"), or any
    other status the call ended with.
    """
    target = endpoint.target
    give_up = time.monotonic() + retry_s
    told = False
    while True:
        try:
            stats = await endpoint.stats()
            if stats.get("serving", True) or not serving:
                return stats
            error: VerifierError = Unavailable("the verifier is not serving")
        except Unavailable as e:
            error = e
        except (Unauthenticated, PermissionDenied) as e:
            raise type(e)(f"verifier {target} refused the token ({e})") from None
        except VerifierError as e:
            err = type(e)(f"verifier {target}: {e}")
            err.code = e.code
            raise err from None
        if time.monotonic() + backoff_s > give_up:
            gave_up = f"; gave up after {retry_s:g} s" if retry_s > 0 else ""
            raise Unavailable(f"verifier {target} unavailable ({short_reason(error)}){gave_up}")
        if not told and on_retry is not None:
            on_retry(retry_notice(target, error, retry_s))
        told = True
        await asyncio.sleep(backoff_s)
