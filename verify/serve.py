"""Start-up and shutdown of the verifier service (docs/design.md §4).

`bind()` listens first — a busy port fails at once, not after minutes of compiling — and
answers grpc.health.v1 NOT_SERVING (every RPC but Stats: UNAVAILABLE "warming up") while the
target loads and its step shapes compile (`Server.warming(done, total)` reports how many, which
Stats answers as `warming_done`/`warming_total`); `Server.ready(verifier)` then puts the
`LocalVerifier` behind it and says SERVING. `start()` does both at once. The server carries
message limits, TLS, health, optional reflection, the Prometheus endpoint and idle eviction;
`Server.drain()` ends it gracefully.

`python -m verify serve` (verify/__main__.py) is the command line over this module; the RPCs
are `verify.servicer`'s, the tenants `verify.tenants`', the metrics `verify.metrics`'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import socket
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection

from jaxspec.compilation.shapes import row_buckets_for
from jaxspec.proto import verifier_pb2 as pb
from jaxspec_host.flags import is_loopback
from verify.local import LocalVerifier
from verify.metrics import MetricsServer, serve_metrics
from verify.scheduler import SchedulerConfig
from verify.servicer import (
    FIRST_MESSAGE_TIMEOUT_S,
    WRITE_TIMEOUT_S,
    VerifierService,
    add_to_server,
)
from verify.tenants import Tenants

log = logging.getLogger("verify.serve")

SERVICE = "jaxspec.v1.Verifier"


# Request headers (metadata) above this many bytes (HPACK-decoded, 32 bytes a header on top
# of its name and value) are refused by gRPC core before any of our code sees the call: an
# HTTP/2 RST_STREAM, which a client reports as RESOURCE_EXHAUSTED with no message (RST_STREAM
# carries none). The soft limit equals the hard one, so a request is refused or not whatever
# the draw (gRPC refuses a random share of requests between the two).
MAX_METADATA_BYTES = 16384


# A connection that has not finished its handshake (TCP accepted, then TLS and the HTTP/2
# preface and settings) within this time is closed (gRPC's default: 120 s).
HANDSHAKE_TIMEOUT_S = 10.0

# Connection and stream limits (gRPC's own options; gRPC's defaults are unbounded). A
# connection with no RPC in flight for MAX_CONNECTION_IDLE_S is closed (GOAWAY, then the
# socket), TLS or not: before, idle connections were kept for ever, and 1,010 of them filled
# a server's 1,024 file descriptors. Every connection is sent GOAWAY after
# MAX_CONNECTION_AGE_S, its streams then given MAX_CONNECTION_AGE_GRACE_S to end before it is
# closed (a session's stream cut there resumes elsewhere, exactly: docs/service.md, Resume).
# A connection carries at most MAX_CONCURRENT_STREAMS streams at once (HTTP/2's
# SETTINGS_MAX_CONCURRENT_STREAMS, advertised; a stream beyond it is refused): above the
# default 64 slots of one verifier, so one client can hold every session it may open.
MAX_CONNECTION_IDLE_S = 60.0
MAX_CONNECTION_AGE_S = 3600.0
MAX_CONNECTION_AGE_GRACE_S = 300.0
MAX_CONCURRENT_STREAMS = 100


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The connection and stream limits `bind()` sets (module constants as defaults; the
    fields are named as `python -m verify serve`'s flags)."""

    max_connection_idle_s: float = MAX_CONNECTION_IDLE_S
    max_connection_age_s: float = MAX_CONNECTION_AGE_S
    max_connection_age_grace_s: float = MAX_CONNECTION_AGE_GRACE_S
    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS

    def __post_init__(self) -> None:
        for name in ("max_connection_idle_s", "max_connection_age_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.max_connection_age_grace_s >= 0:
            raise ValueError(
                f"max_connection_age_grace_s must be >= 0, got {self.max_connection_age_grace_s}"
            )
        if not 1 <= self.max_concurrent_streams < 2**31:
            raise ValueError(
                f"max_concurrent_streams must be in [1, 2**31), got {self.max_concurrent_streams}"
            )

    def options(self) -> list[tuple[str, int]]:
        """As gRPC server options."""
        return [
            ("grpc.max_connection_idle_ms", int(self.max_connection_idle_s * 1000)),
            ("grpc.max_connection_age_ms", int(self.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(self.max_connection_age_grace_s * 1000)),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
        ]


class RateLimitedLog(logging.Filter):
    """At most `burst` records of one kind (logger and message template) per `window_s`
    seconds; the first one let through after some were dropped says how many. For loggers
    whose records a client can cause in bulk (asyncio's, gRPC's), so that a flood of bad
    connections cannot fill the log; nothing of ours is dropped."""

    def __init__(self, burst: int = 5, window_s: float = 60.0, clock=time.monotonic):
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self._seen: dict[tuple[str, str], list[float]] = {}  # kind -> [window start, n, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        state = self._seen.get(key)
        if state is None or now - state[0] >= self.window_s:
            dropped = state[2] if state else 0
            state = self._seen[key] = [now, 0, 0]
            if dropped:
                record.msg = f"{record.msg} ({int(dropped)} similar messages dropped before)"
        state[1] += 1
        if state[1] > self.burst:
            state[2] += 1
            return False
        return True


def rate_limit_client_caused_logs(burst: int = 5, window_s: float = 60.0) -> None:
    """Put a `RateLimitedLog` on the loggers a client can make write (asyncio, gRPC's)."""
    for name in ("asyncio", "grpc._cython.cygrpc", "grpc.aio", "grpc._server"):
        logging.getLogger(name).addFilter(RateLimitedLog(burst, window_s))


def stream_window(limit: int) -> int:
    """The receive window of a stream (bytes gRPC core takes ahead of the handler): 4 MiB, or
    two of the largest messages if more."""
    return max(4 << 20, 2 * limit)


def message_limit(vocab: int, max_gamma: int, prompt_len: int) -> int:
    """The largest valid message (a full-q block, or the longest prompt), with headroom."""
    block = max_gamma * (vocab * 4 + 16) + 256
    return 2 * max(block, prompt_len * 10 + 256)


# ---- before anything loads -------------------------------------------------------------------


def insecure_public_reason(host: str, *, tenants: bool, tls: bool) -> str | None:
    """Why serving on `host` would be open to the network, or None when it is not: a
    non-loopback address needs both a tenants file (else anyone who reaches the port uses the
    accelerator) and TLS (else bearer tokens and token ids cross the network in the clear)."""
    if is_loopback(host):
        return None
    problems = []
    if not tenants:
        problems.append("without a --tenants file anyone who can reach the port can use it")
    if not tls:
        problems.append(
            "without TLS (--tls-cert/--tls-key) tokens and token ids cross the network in the clear"
        )
    if not problems:
        return None
    return (
        f"--host {host} is not a loopback address: {'; '.join(problems)}. Add them, serve on "
        "--host 127.0.0.1, or pass --allow-insecure-public if that is what you mean"
    )


def scheduler_config_from_args(args: Any, **given: Any) -> SchedulerConfig:
    """The scheduler the flags describe (`jaxspec_host.flags.add_verifier_limits`; a size the
    command has no flag for takes `SchedulerConfig`'s default, `given` overrides): row
    buckets from --max-sessions, each a multiple of the mesh's data shards (`args.mesh`,
    where the command has one). `ValueError` for sizes out of range."""
    names = [f.name for f in dataclasses.fields(SchedulerConfig)]
    fields = {n: getattr(args, n) for n in names if hasattr(args, n)} | given
    data, _ = getattr(args, "mesh", (1, 1))
    sessions = fields.get("max_sessions", SchedulerConfig.max_sessions)
    return SchedulerConfig(**fields, row_buckets=row_buckets_for(sessions, data))


def _why_not_bound(host: str, port: int) -> str:
    """The operating system's reason a port cannot be bound (gRPC's error does not say)."""
    return _bind_error(host, port) or "gRPC could not bind it (GRPC_VERBOSITY=debug says why)"


def _bind_error(host: str, port: int) -> str | None:
    """Why a plain socket cannot bind host:port as gRPC would (None: it can). Asked before
    gRPC tries, so a busy port is one clear line without gRPC core's own `E... add_port.cc`
    log line on stderr first."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            s.bind(addr)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"{e.strerror}: another process holds port {port} (choose one with --port)"
        return e.strerror or str(e)
    return None


# ---- the running server ----------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    """A running service: the grpc server, its servicer, health, the bound port and the
    metrics endpoint (None unless asked for). NOT_SERVING until `ready()`."""

    grpc_server: Any
    service: VerifierService
    health: Any
    port: int
    metrics: MetricsServer | None = None
    evict_every_s: float = 5.0
    _tasks: list[asyncio.Task] = dataclasses.field(default_factory=list)
    _stopped: bool = False

    def warming(self, done: int, total: int) -> None:
        """Report the warm-up's count: `done` of `total` batch shapes compiled, what Stats
        answers (`warming_done`/`warming_total`) while health still says NOT_SERVING, and on
        while the rest compile in the background. Safe from the warm-up's worker thread."""
        self.service.warming_progress(done, total)

    async def ready(self, verifier: LocalVerifier) -> None:
        """Serve with `verifier` (loaded and warmed up): health SERVING, idle eviction on."""
        self.service.attach(verifier)

        async def evict() -> None:
            while True:
                await asyncio.sleep(self.evict_every_s)
                await verifier.evict_idle()

        self._tasks.append(asyncio.ensure_future(evict()))
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def drain(self, timeout_s: float = 30.0, min_s: float = 0.0) -> None:
        """Stop taking work, answer what was taken, end every stream with UNAVAILABLE.
        Stays up (NOT_SERVING) at least `min_s` so load balancers notice before the port
        closes, at most `timeout_s` for streams to finish."""
        await self.health.enter_graceful_shutdown()  # NOT_SERVING, and stays so
        self.service.draining.set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < min_s or (
            self.service.streams and time.monotonic() - t0 < timeout_s
        ):
            await asyncio.sleep(0.02)
        await self.stop(grace=1.0)
        s = self.service
        log.info(
            "drained: %d blocks answered while draining, %d taken but unanswered",
            s.answered_draining, s.unanswered_draining,
        )  # fmt: skip

    async def stop(self, grace: float | None = None) -> None:
        """Stop at once (after `grace` seconds for calls in flight): no drain. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
        await self.grpc_server.stop(grace)
        # streams' ends still closing their sessions (`VerifyStream._end`): let them finish
        await asyncio.gather(*self.service.ending, return_exceptions=True)
        if self.service.verifier is not None:
            await self.service.verifier.aclose()


def server_options(
    limit: int, handshake_timeout_s: float, limits: ConnectionLimits | None = None
) -> list[tuple[str, Any]]:
    """The gRPC server's options: message size `limit`, header and flow-control limits, the
    handshake timeout, and the connection and stream `limits`."""
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 0),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        # Flow control: a fixed per-stream receive window, not one grown by BDP probes
        # (on loopback those let gRPC core buffer 50-100 MB of a stream whose handler
        # reads nothing); with MAX_UNANSWERED blocks read ahead, a client that never
        # reads its answers holds at most about two of these windows (what gRPC core
        # grants beyond what the handler read) plus those blocks and one more message.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
        ("grpc.http2.lookahead_bytes", stream_window(limit)),
        *(limits or ConnectionLimits()).options(),
    ]


async def bind(
    config: SchedulerConfig,
    vocab: int,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tenants: Tenants | None = None,
    tls: tuple[bytes, bytes] | None = None,
    reflection: bool = False,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    evict_every_s: float = 5.0,
    write_timeout_s: float = WRITE_TIMEOUT_S,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    first_message_timeout_s: float = FIRST_MESSAGE_TIMEOUT_S,
    limits: ConnectionLimits | None = None,
) -> Server:
    """Listen on host:port (0 picks a free port) for a verifier of `config` over a target of
    `vocab` tokens (the message limit), warming up: health NOT_SERVING and every RPC but
    Stats UNAVAILABLE until `Server.ready()`. A port that cannot be bound raises `OSError`
    saying why.

    `tls` is (private key, certificate chain) in PEM; `metrics_port` (0: a free one) turns on
    the Prometheus endpoint on `metrics_host`, loopback unless said otherwise, whatever
    `host` is. `write_timeout_s`: a Verify stream whose client reads no answer this long is
    ended (`verify.servicer.WRITE_TIMEOUT_S`); `handshake_timeout_s`: a connection that has
    not finished its TLS and HTTP/2 handshake this long is closed; `first_message_timeout_s`:
    a Verify stream that sends no first message this long is ended DEADLINE_EXCEEDED;
    `limits`: idle and age of a connection, streams per connection (`ConnectionLimits`)."""
    for name, value in (("port", port), ("metrics_port", metrics_port)):
        if value is not None and not 0 <= value <= 65535:
            raise ValueError(f"{name} must be in [0, 65535] (0: a free one), got {value}")
    limit = message_limit(vocab, config.max_gamma, config.max_len)
    server = grpc.aio.server(options=server_options(limit, handshake_timeout_s, limits))
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    why = _bind_error(host, port) if port else None
    if why is not None:
        raise OSError(f"cannot listen on {address}: {why}")
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            key, cert = tls
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError:
        raise OSError(f"cannot listen on {address}: {_why_not_bound(host, port)}") from None
    service = VerifierService(
        tenants or Tenants(None),
        config.row_buckets,
        write_timeout_s=write_timeout_s,
        first_message_timeout_s=first_message_timeout_s,
        vocab_size=vocab,
    )
    add_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if reflection:
        names = (pb.DESCRIPTOR.services_by_name["Verifier"].full_name, health.SERVICE_NAME)
        grpc_reflection.enable_server_reflection((*names, grpc_reflection.SERVICE_NAME), server)
    await server.start()
    out = Server(server, service, health_servicer, bound, evict_every_s=evict_every_s)
    if metrics_port is not None:
        try:
            out.metrics = serve_metrics(service.metrics.registry, metrics_host, metrics_port)
        except OSError as e:
            await out.stop()
            raise OSError(f"cannot serve metrics on {metrics_host}:{metrics_port}: {e}") from None
    return out


async def start(verifier: LocalVerifier, **kw: Any) -> Server:
    """`bind()` for `verifier`'s scheduler, then `ready()` at once: serve a verifier that is
    already loaded (and warmed up, if that matters). Keywords as `bind()`'s."""
    sch = verifier.scheduler
    server = await bind(sch.config, sch.vocab, **kw)
    await server.ready(verifier)
    return server
