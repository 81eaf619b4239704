"""`GrpcEndpoint`: the edge's `VerifierEndpoint` over gRPC (`jaxspec.v1.Verifier`).

One channel per endpoint; one bidirectional Verify stream per session, which its first
message opens: the session lives in that one stream, so on the one replica it reached. Blocks
go up as they are drafted, results come back in order and resolve the callers' futures;
ending the stream closes the session. A failed stream fails every block in flight with the
protocol error its status maps to (UNAVAILABLE -> `Unavailable`, which `run_session` answers
by resuming: reopening the session, in a new stream, with its committed tokens).

A fleet of verifiers is one channel too: `"host:a,host:b"` (or a gRPC name that resolves to
several addresses, `dns:///verifier.svc:50051`) balances streams with gRPC's own
`round_robin` policy and skips a replica whose grpc.health.v1 status is not SERVING (gRPC's
client-side health checking), so a new or resumed session goes to a live replica
(`channel_target`).

`check_verifier` is what a command asks first, before it loads or compiles anything: one
Stats call proves the verifier is reachable, takes the token and is serving.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import grpc

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
    wire,
)

# Words for the usual reasons a channel cannot reach a verifier (grpc's details are long).
HTTP1 = (
    "the port answers, but not in HTTP/2: an HTTP/1 server (a web or metrics port?), "
    "not a gRPC verifier"
)
_REASONS = (
    ("failed parsing http/2", HTTP1),
    ("http1.x", HTTP1),
    ("connection refused", "connection refused"),
    ("errors resolving", "name not resolved"),
    ("domain name not found", "name not resolved"),
    ("handshake", "TLS handshake failed"),
    ("ssl", "TLS error"),
    ("deadline", "no answer in time"),
    ("not serving", "not serving: warming up or draining"),
)


def _status_lost(e: grpc.RpcError) -> bool:
    """Whether grpc.aio reported a stream's end as its generic INTERNAL error, losing the
    server's status (grpc/grpc#36066: a write that raced the end of the stream)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else None
    return code == grpc.StatusCode.INTERNAL and details == "Internal error from Core"


def error_from_rpc(e: grpc.RpcError) -> VerifierError:
    """The protocol error for a failed call (a server going away reads as Unavailable)."""
    code = e.code() if hasattr(e, "code") else None
    name = code.name if code is not None else "UNKNOWN"
    details = (e.details() if hasattr(e, "details") else None) or name
    if name == "CANCELLED":  # the server stopped under us (our own cancels never get here)
        name = "UNAVAILABLE"
    if _status_lost(e):
        # grpc.aio replaces the real status with this one when a write races the end of
        # the stream (grpc/grpc#36066): a server that died or ended the stream. Reopen.
        name = "UNAVAILABLE"
    if name == "INTERNAL" and "RST_STREAM" in details:
        # An L7 proxy (nginx, deploy/) whose replica died mid-stream resets the stream
        # (HTTP/2 RST_STREAM, INTERNAL_ERROR): the replica is gone, not broken. Reopen.
        name = "UNAVAILABLE"
    cls = ERRORS.get(name)
    if cls is None:
        err = VerifierError(f"{name}: {details}")
        err.code = name
        return err
    return cls(details)


# gRPC's own client-side balancing over a fleet: a stream per pick, replicas that are down
# or not SERVING (grpc.health.v1, "" = the whole server) left out of the picks.
FLEET_SERVICE_CONFIG = json.dumps(
    {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}
)


MAX_PORT = 65535  # TCP ports are 1..65535 (0 is "any" for a listener, never a peer)

# How soon a channel tries again to connect to a verifier that went away: gRPC's defaults
# (1 s, growing 1.6x to 120 s) left a verifier back after a 45 s outage unused for 12.9 s;
# capped at 1 s, a returning verifier is reached within about a second (±20% jitter).
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _split_host_port(address: str) -> tuple[str, str]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a verifier address is host:port, got {address!r}")
    if not 1 <= int(port) <= MAX_PORT:
        raise ValueError(f"a verifier's port is in [1, {MAX_PORT}], got {address!r}")
    return host.strip("[]"), port


def _is_uri(address: str) -> bool:
    return "://" in address or address.startswith(("ipv4:", "ipv6:", "dns:", "unix:"))


def channel_target(verifier: str | list[str] | tuple[str, ...]) -> tuple[str, list[tuple]]:
    """The gRPC target and channel options for `verifier`: one "host:port" as it is; several
    ("a:1,b:2" or a list) as an `ipv4:` (or `ipv6:`) address list, each name resolved once
    here, balanced with gRPC's `round_robin` and health checking; a gRPC URI
    ("dns:///name:port", "ipv4:...") balanced the same way (a name with several addresses,
    e.g. a headless Kubernetes Service, is a fleet). `ValueError` for a malformed address or
    names that share no address family."""
    parts = [verifier] if isinstance(verifier, str) else list(verifier)
    addresses = [a.strip() for p in parts for a in p.split(",") if a.strip()]
    if not addresses:
        raise ValueError("no verifier address given")
    fleet = [("grpc.service_config", FLEET_SERVICE_CONFIG)]
    if len(addresses) == 1:
        (address,) = addresses
        if _is_uri(address):
            return address, fleet
        _split_host_port(address)
        return address, []
    if any(_is_uri(a) for a in addresses):
        raise ValueError("a list of verifiers is host:port,host:port (no URIs)")
    hosts_ports = [_split_host_port(a) for a in addresses]
    resolved: list[dict[int, str]] = []  # per address: family -> its first IP
    for address, (host, port) in zip(addresses, hosts_ports, strict=True):
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            raise ValueError(f"verifier {address}: name not resolved ({e})") from None
        found: dict[int, str] = {}
        for family, _, _, _, sockaddr in infos:
            found.setdefault(family, sockaddr[0])
        resolved.append(found)
    for family, scheme, form in (
        (socket.AF_INET, "ipv4", "{}:{}"),
        (socket.AF_INET6, "ipv6", "[{}]:{}"),
    ):
        if all(family in r for r in resolved):
            ips = [r[family] for r in resolved]
            ports = [port for _, port in hosts_ports]
            target = f"{scheme}:" + ",".join(map(form.format, ips, ports))
            first = hosts_ports[0][0]  # TLS checks the certificate against the first name
            return target, [
                *fleet,
                ("grpc.ssl_target_name_override", first),
                ("grpc.default_authority", first),
            ]
    raise ValueError(f"the verifiers {addresses} share no address family (IPv4 or IPv6)")


@dataclasses.dataclass
class _Stream:
    call: Any
    pending: collections.deque  # futures, in send order
    reader: asyncio.Task | None = None
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one write at a time
    error: VerifierError | None = None  # how it ended: every later block fails with it


class GrpcEndpoint:
    """Connects to `target`: "host:port", a fleet "host:a,host:b" (or a list of them), or a
    gRPC URI (`channel_target`); `token` is the tenant's bearer token; `tls_ca` (PEM bytes or
    a path) turns on TLS, trusting that CA (None with `tls=True`: system CAs). `timeout_s` is
    the deadline of each unary call, of opening a session and of each block's result."""

    def __init__(
        self,
        target: str | list[str] | tuple[str, ...],
        *,
        token: str | None = None,
        tls: bool = False,
        tls_ca: bytes | str | None = None,
        tls_server_name: str | None = None,
        timeout_s: float = 30.0,
        max_message_bytes: int = 64 << 20,
    ):
        address, channel_options = channel_target(target)
        options = dict(RECONNECT_OPTIONS) | dict(channel_options)
        # The name TLS checks the certificate against: given, else the fleet's first name.
        server_name = tls_server_name or options.pop("grpc.ssl_target_name_override", None)
        options["grpc.max_receive_message_length"] = max_message_bytes
        options["grpc.max_send_message_length"] = max_message_bytes
        if tls or tls_ca is not None:
            if isinstance(tls_ca, str):
                with open(tls_ca, "rb") as f:
                    tls_ca = f.read()
            if server_name:
                options["grpc.ssl_target_name_override"] = server_name
            creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self.channel = grpc.aio.secure_channel(address, creds, options=list(options.items()))
        else:
            self.channel = grpc.aio.insecure_channel(address, options=list(options.items()))
        self.target = target if isinstance(target, str) else ",".join(target)
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
        """Open a session in a new Verify stream (its first message): the session lives in
        that stream, on whichever replica the channel picked for it."""
        call = self.stub.Verify(metadata=self.metadata)
        try:
            async with asyncio.timeout(self.timeout_s):
                try:
                    await call.write(pb.VerifyRequest(open=wire.config_to_proto(config)))
                except (grpc.RpcError, asyncio.InvalidStateError):
                    # The server ended the call first (e.g. UNAUTHENTICATED): grpc.aio may
                    # report the write as INTERNAL (grpc/grpc#36066); the read raises the
                    # call's real status.
                    pass
                reply = await call.read()
        except TimeoutError:
            call.cancel()
            raise DeadlineExceeded(f"no session opened within {self.timeout_s} s") from None
        except grpc.RpcError as e:
            call.cancel()
            if _status_lost(e):
                # The server's refusal (a missing or wrong token: it answers before reading)
                # was lost in the race: a unary call, whose status is kept, asks again and
                # raises it; if that call succeeds, the stream really failed (Unavailable).
                await self._unary(self.stub.Stats, pb.StatsRequest())
            raise error_from_rpc(e) from None
        except asyncio.CancelledError:
            call.cancel()
            raise
        if reply is grpc.aio.EOF or reply.WhichOneof("kind") != "opened":
            # `read` raises for an error status: this is an OK end, or a verifier that does
            # not speak this protocol
            call.cancel()
            raise Unavailable("the verifier ended the stream without opening the session")
        info = wire.info_from_proto(reply.opened)
        stream = self._streams[info.session_id] = _Stream(call, collections.deque())
        stream.reader = asyncio.ensure_future(self._read(info.session_id, stream))
        return info

    async def verify(self, block: DraftBlock) -> VerifyResult:
        stream = self._streams.get(block.session_id)
        if stream is None:
            raise NotFound("no open stream for this session: open_session first")
        if stream.error is not None:  # the session ended with its stream (resume: reopen)
            raise stream.error
        fut: asyncio.Future[VerifyResult] = asyncio.get_running_loop().create_future()
        # A failed stream fails every pending block, also those whose callers have moved
        # on (a session that already raised): mark the error seen so asyncio stays quiet.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        message = pb.VerifyRequest(block=wire.block_to_proto(block))
        async with stream.lock:  # grpc.aio allows one write in flight; FIFO keeps the order
            if stream.error is not None:  # ended while we waited for the lock
                raise stream.error
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
            while (msg := await stream.call.read()) is not grpc.aio.EOF:
                if stream.pending:
                    fut = stream.pending.popleft()
                    if not fut.done():  # a caller that timed out has cancelled it
                        fut.set_result(wire.result_from_proto(msg.result))
            error = Unavailable("the verifier ended the stream")
        except grpc.RpcError as e:
            error = error_from_rpc(e)
        except asyncio.CancelledError:
            error = None  # closed by us: whoever still waits is cancelled with it
        stream.error = error or Unavailable("the session's stream was closed")
        while stream.pending:
            fut = stream.pending.popleft()
            if fut.done():
                continue
            if error is None:
                fut.cancel()
            else:
                fut.set_exception(error)

    @property
    def open_sessions(self) -> int:
        """How many sessions this endpoint holds a stream open for."""
        return len(self._streams)

    async def close_session(self, session_id: str) -> None:
        """End the session's stream, which frees its slot (the session lives in the stream; a
        CloseSession call could reach another replica), and return once the verifier has
        freed it: a half-close, after which the verifier answers the blocks still in flight,
        closes the session and ends the stream; a verifier that does not end it within
        `timeout_s` (or is gone, and has freed it already) has the stream cancelled.

        Called from a task being cancelled (a client that went away, Ctrl-C), the stream is
        cancelled at once: nobody wants the blocks in flight, and a loaded verifier could
        take seconds to answer them before it frees the slot."""
        stream = self._streams.get(session_id)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            stream = None
        if stream is not None and stream.error is None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    async with stream.lock:  # after the last block's write
                        await stream.call.done_writing()
                    await asyncio.shield(stream.reader)
            except (TimeoutError, grpc.RpcError, asyncio.InvalidStateError):
                pass  # cancelled below
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


WARMING_WAIT_S = 600.0  # how long a client waits for a verifier that says it is warming up


def warming_words(stats: dict[str, Any]) -> str | None:
    """`warming up: 5/9 batch shapes compiled` for the Stats of a verifier that is not
    serving yet and says how far its warm-up is (`warming_done`/`warming_total`); None
    when it serves, or tells no count (an older verifier, or none to compile)."""
    done, total = int(stats.get("warming_done", 0)), int(stats.get("warming_total", 0))
    if stats.get("serving", True) or total <= 0:
        return None
    return f"warming up: {done}/{total} batch shapes compiled"


def at_most_every(
    say: Callable[[str], None], every_s: float = 2.0, clock: Callable[[], float] = time.monotonic
) -> Callable[[str], None]:
    """`say`, passed on at most once per `every_s` seconds (the first at once): an
    `on_wait` for `check_verifier` that prints lines, so a wait shows every ~2 s that it
    moves without a line per retry."""
    last = [float("-inf")]

    def throttled(text: str) -> None:
        now = clock()
        if now - last[0] >= every_s:
            last[0] = now
            say(text)

    return throttled


async def check_verifier(
    endpoint: GrpcEndpoint,
    *,
    retry_s: float = 0.0,
    backoff_s: float = 0.5,
    on_retry: Callable[[str], None] | None = None,
    serving: bool = True,
    on_wait: Callable[[str], None] | None = None,
    warming_s: float = 0.0,
) -> dict[str, Any]:
    """The verifier's Stats, asked before anything is loaded or compiled: one call proves it
    is reachable, accepts the endpoint's token (Stats is authenticated like every call) and
    (with `serving`) is serving: not warming up, not draining.

    An unavailable or not-serving verifier is retried every `backoff_s` for `retry_s` seconds
    (a restart takes a while); `on_retry(notice)` hears once that it is retrying, why, and
    until when (`retry_notice`); `on_wait(words)` hears at every later retry what it waits
    for and for how long (`verifier H:P warming up: 5/9 batch shapes compiled; waited 12 s`), so a
    screen can show the wait move. Raises the protocol error, its message naming the address:
    `Unavailable` ("verifier H:P unavailable (connection refused); gave up after 30 s"),
    `Unauthenticated` / `PermissionDenied` ("verifier H:P refused the token (...)"), or any
    other status the call ended with.

    A verifier that answers it is warming up with a count (`warming_words`) is coming, only
    slowly (a cold start compiles for minutes on a small machine): it is waited for up to
    `warming_s` if that is longer than `retry_s`, the notice naming that bound.
    """
    t0, tries = time.monotonic(), 0
    reasons: list[str] = []  # each distinct reason, in order: the first is often the telling one
    while True:
        stats, error = await _stats_or_unavailable(endpoint, serving)
        if error is None:
            return stats
        if short_reason(error) not in reasons:
            reasons.append(short_reason(error))
        bound = max(retry_s, warming_s) if warming_words(stats) else retry_s
        if time.monotonic() + backoff_s > t0 + bound:
            gave_up = f"; gave up after {bound:g} s" if bound > 0 else ""
            why = reasons[0] + (f"; lately: {reasons[-1]}" if len(reasons) > 1 else "")
            raise Unavailable(f"verifier {endpoint.target} unavailable ({why}){gave_up}")
        if tries == 0 and on_retry is not None:
            on_retry(retry_notice(endpoint.target, error, bound))
        elif on_wait is not None:  # from the second retry on: the notice said the first
            waited = time.monotonic() - t0
            on_wait(f"verifier {endpoint.target} {short_reason(error)}; waited {waited:.0f} s")
        tries += 1
        await asyncio.sleep(backoff_s)


async def _stats_or_unavailable(
    endpoint: GrpcEndpoint, serving: bool
) -> tuple[dict[str, Any], VerifierError | None]:
    """`check_verifier`'s one try: (the Stats, None) when it passes; (the Stats so far, why)
    when the verifier is unavailable ({}) or (with `serving`) not serving, worth retrying;
    any other error raised, its message naming the address."""
    target = endpoint.target
    try:
        stats = await endpoint.stats()
    except Unavailable as e:
        return {}, e
    except (Unauthenticated, PermissionDenied) as e:
        raise type(e)(f"verifier {target} refused the token ({e})") from None
    except VerifierError as e:
        err = type(e)(f"verifier {target}: {e}")
        err.code = e.code
        raise err from None
    if stats.get("serving", True) or not serving:
        return stats, None
    return stats, Unavailable(warming_words(stats) or "the verifier is not serving")
