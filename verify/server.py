"""The verifier as a gRPC service (`jaxspec.v1.Verifier`, docs/design.md §4) over `LocalVerifier`.

    caller --Bearer token--> tenant --> OpenSession / Verify stream / CloseSession / Stats
                                           |
                              LocalVerifier (one scheduler, one batched step per tick)

Every RPC authenticates first (no state is created for an unknown caller); every protocol
error leaves as its own status (`jaxspec.protocol` names it), never UNKNOWN. A Verify stream
carries one session: blocks are answered in order; a client that goes away (cancel,
disconnect, deadline) frees its session's slot. `drain()` stops taking sessions and blocks,
answers what it already took, then ends every stream with UNAVAILABLE so clients resume
elsewhere — with exactly the tokens they would have had, because draws are keyed by position.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import hmac
import logging
import pathlib
import time
import tomllib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from jaxspec import wire
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    VerifierError,
)
from verify.local import LocalVerifier

log = logging.getLogger("verify.server")

SERVICE = "jaxspec.v1.Verifier"
ANONYMOUS = "anonymous"


@dataclasses.dataclass(frozen=True)
class Tenant:
    name: str
    token_sha256: str  # never the token itself: nothing that could leak it is kept
    max_sessions: int = 16
    tokens_per_s: float = 0.0  # verified positions per second; 0 = unlimited


class Tenants:
    """Bearer-token tenants from a TOML file, or (no file) everyone as one anonymous tenant.

    [tenants.alice]
    token = "..."            # or token_sha256 = "<hex>" to keep the secret out of the file
    max_sessions = 16        # live sessions at once
    tokens_per_s = 400       # verified positions per second (drafts + 1 per block), 0 = off
    """

    def __init__(self, tenants: list[Tenant] | None, anonymous: Tenant | None = None):
        self.open = tenants is None
        self.by_hash = {t.token_sha256: t for t in tenants or ()}
        self.anonymous = anonymous or Tenant(ANONYMOUS, "", max_sessions=1 << 30)

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Tenants:
        try:
            raw = tomllib.loads(pathlib.Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"cannot read tenants file {path}: {e}") from None
        out = []
        for name, t in raw.get("tenants", {}).items():
            if not isinstance(t, dict) or ("token" in t) == ("token_sha256" in t):
                raise ValueError(f"tenant {name!r} needs exactly one of token / token_sha256")
            digest = t.get("token_sha256") or _sha256(str(t["token"]))
            out.append(
                Tenant(
                    name=name,
                    token_sha256=digest.lower(),
                    max_sessions=int(t.get("max_sessions", 16)),
                    tokens_per_s=float(t.get("tokens_per_s", 0.0)),
                )
            )
        if not out:
            raise ValueError(f"tenants file {path} defines no [tenants.<name>] table")
        if len({t.token_sha256 for t in out}) != len(out):
            raise ValueError("two tenants share a token")
        return cls(out)

    def identify(self, metadata: Any) -> Tenant | None:
        """The caller's tenant from `authorization: Bearer <token>` metadata, else None."""
        if self.open:
            return self.anonymous
        token = None
        for key, value in metadata or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, rest = value.partition(" ")
                if scheme.lower() == "bearer" and rest:
                    token = rest.strip()
        if token is None:
            return None
        digest = _sha256(token)
        for known, tenant in self.by_hash.items():  # constant time per comparison
            if hmac.compare_digest(known, digest):
                return tenant
        return None


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class _Bucket:
    """Token bucket: `rate` per second, bursts up to one second's worth (or one cost)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.level = rate
        self.t = time.monotonic()

    async def take(self, cost: float) -> None:
        while True:
            now = time.monotonic()
            self.level = min(max(self.rate, cost), self.level + (now - self.t) * self.rate)
            self.t = now
            if self.level >= cost:
                self.level -= cost
                return
            await asyncio.sleep((cost - self.level) / self.rate)


@dataclasses.dataclass
class Counters:
    """Cumulative figures for /metrics (sessions come and go; these do not)."""

    drafted: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    accepted: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    committed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    stale: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    rejected: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter
    )  # (method, status)
    sessions_opened: collections.Counter[str] = dataclasses.field(
        default_factory=collections.Counter
    )


class VerifierService(pb_grpc.VerifierServicer):
    """The `jaxspec.v1.Verifier` servicer; `verifier` does the work, `tenants` the auth."""

    def __init__(self, verifier: LocalVerifier, tenants: Tenants):
        self.verifier = verifier
        self.tenants = tenants
        self.counters = Counters()
        self.draining = asyncio.Event()
        self.streams = 0
        self.answered_draining = 0  # blocks answered while draining
        self.unanswered_draining = 0  # taken, then the stream ended in the drain: must stay 0
        self._buckets: dict[str, _Bucket] = {}

    # ---- helpers -------------------------------------------------------------------------

    async def _fail(self, context: Any, method: str, code: str, message: str) -> None:
        self.counters.rejected[(method, code)] += 1
        await context.abort(grpc.StatusCode[code], message)

    async def _auth(self, context: Any, method: str) -> Tenant:
        tenant = self.tenants.identify(context.invocation_metadata())
        if tenant is None:
            await self._fail(context, method, "UNAUTHENTICATED", "missing or invalid token")
        return tenant

    def _live_sessions(self, tenant: str) -> int:
        return sum(s.tenant == tenant for s in list(self.verifier.scheduler.sessions.values()))

    # ---- RPCs ----------------------------------------------------------------------------

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Any):
        tenant = await self._auth(context, "OpenSession")
        if self.draining.is_set():
            await self._fail(context, "OpenSession", "UNAVAILABLE", "the verifier is draining")
        try:
            if self._live_sessions(tenant.name) >= tenant.max_sessions:
                raise ResourceExhausted(f"tenant limit of {tenant.max_sessions} live sessions")
            config = wire.config_from_proto(request)
            info = await self.verifier.for_tenant(tenant.name).open_session(config)
        except VerifierError as e:
            await self._fail(context, "OpenSession", e.code, str(e))
        self.counters.sessions_opened[tenant.name] += 1
        return wire.info_to_proto(info)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any):
        tenant = await self._auth(context, "CloseSession")
        try:
            await self.verifier.for_tenant(tenant.name).close_session(request.session_id)
        except VerifierError as e:
            await self._fail(context, "CloseSession", e.code, str(e))
        return pb.CloseSessionResponse()

    async def Stats(self, request: pb.StatsRequest, context: Any):
        await self._auth(context, "Stats")
        s = self.stats()
        return pb.StatsResponse(**s)

    def stats(self) -> dict[str, Any]:
        sch = self.verifier.scheduler
        m = sch.metrics
        return dict(
            sessions=len(sch.sessions),
            queued_blocks=sch.pending(),
            steps=m.steps,
            last_step_s=m.last_step_s,
            last_rows=m.last_rows,
            last_bucket_rows=m.last_bucket_rows,
            mean_occupancy=m.mean_occupancy,
            tokens_committed=m.tokens_committed,
            serving=not self.draining.is_set(),
        )

    async def Verify(self, request_iterator: AsyncIterator[pb.DraftBlock], context: Any):
        """Blocks of one session up, results down in order. Errors end the stream with their
        status after every earlier block's result (the session stays for a new stream);
        the end of the stream — half-close, cancel, a vanished client — closes the session."""
        tenant = await self._auth(context, "Verify")
        endpoint = self.verifier.for_tenant(tenant.name)
        bucket = None
        if tenant.tokens_per_s > 0:
            bucket = self._buckets.setdefault(tenant.name, _Bucket(tenant.tokens_per_s))
        items: asyncio.Queue[Any] = asyncio.Queue()  # futures of results, or an error, or None
        session: list[str] = []  # the stream's session id, once known
        counts = [0, 0]  # this stream's blocks taken, answered

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    if self.draining.is_set():
                        raise Unavailable("the verifier is draining: resume the session")
                    block = wire.block_from_proto(msg)
                    if not session:
                        endpoint.scheduler.get(block.session_id, tenant.name)  # NotFound
                        session.append(block.session_id)
                    elif block.session_id != session[0]:
                        raise InvalidArgument("a Verify stream carries one session")
                    if bucket is not None:
                        await bucket.take(len(block.tokens) + 1)
                    items.put_nowait((block, asyncio.ensure_future(endpoint.verify(block))))
                    counts[0] += 1
                items.put_nowait(None)
            except VerifierError as e:
                items.put_nowait(e)
            except grpc.RpcError:
                items.put_nowait(None)  # the client went away: the writer sees the cancel

        reader = asyncio.ensure_future(read())
        drain = asyncio.ensure_future(self.draining.wait())
        self.streams += 1
        keep = False  # True: the stream failed on bad input, the session stays
        try:
            while True:
                if items.empty() and drain.done() and reader.done():
                    raise Unavailable("the verifier is draining: resume the session")
                get = asyncio.ensure_future(items.get())
                await asyncio.wait({get, drain}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    # Draining: stop reading; answer what was taken, then end the stream.
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                    continue
                item = get.result()
                if item is None:  # half-closed, or a vanished client seen as one
                    return
                if isinstance(item, VerifierError):
                    raise item
                block, fut = item
                res = await fut
                self._count(tenant.name, block, res)
                yield wire.result_to_proto(res)
                self.answered_draining += self.draining.is_set()
                counts[1] += 1
        except VerifierError as e:
            keep = True  # the session stays; the client may open another stream
            await self._fail(context, "Verify", e.code, str(e))
        finally:
            self.streams -= 1
            drain.cancel()
            reader.cancel()
            if self.draining.is_set():
                self.unanswered_draining += counts[0] - counts[1]
            if not keep and session and not self.draining.is_set():
                # Ended, cancelled, disconnected or past its deadline (a killed client can
                # look like a half-close): nobody will send or read more, so the slot goes
                # back to the pool now.
                await self._close_quietly(endpoint, session[0])

    @staticmethod
    async def _close_quietly(endpoint: LocalVerifier, session_id: str) -> None:
        try:
            await endpoint.close_session(session_id)
        except NotFound:
            pass  # closed already (CloseSession, eviction, the other path here)

    def _count(self, tenant: str, block: Any, res: Any) -> None:
        c = self.counters
        if res.stale:
            c.stale[tenant] += 1
            return
        c.drafted[tenant] += len(block.tokens)
        c.accepted[tenant] += res.accepted
        c.committed[tenant] += len(res.tokens)

    # ---- metrics -------------------------------------------------------------------------

    def prometheus(self) -> str:
        """Prometheus text exposition of the counters and the scheduler's gauges."""
        c, s = self.counters, self.stats()
        rejected = {f'method="{m}",status="{code}"': v for (m, code), v in c.rejected.items()}
        families = [  # name, type, help, {labels: value}
            ("drafted_tokens_total", "counter", "drafts verified", c.drafted),
            ("accepted_tokens_total", "counter", "drafts accepted", c.accepted),
            ("committed_tokens_total", "counter", "tokens committed", c.committed),
            ("stale_blocks_total", "counter", "blocks answered stale", c.stale),
            ("sessions_opened_total", "counter", "sessions opened", c.sessions_opened),
            ("rejected_requests_total", "counter", "requests refused, by status", rejected),
            ("sessions", "gauge", "live sessions", {"": s["sessions"]}),
            ("queued_blocks", "gauge", "blocks waiting", {"": s["queued_blocks"]}),
            ("verify_steps_total", "counter", "batched verify steps", {"": s["steps"]}),
            ("last_step_seconds", "gauge", "last verify step", {"": s["last_step_s"]}),
            ("last_batch_rows", "gauge", "rows in the last step", {"": s["last_rows"]}),
            ("batch_occupancy", "gauge", "mean live/padded rows", {"": s["mean_occupancy"]}),
            ("serving", "gauge", "1 unless draining", {"": int(s["serving"])}),
        ]
        lines = []
        for name, kind, help_, rows in families:
            lines += [f"# HELP jaxspec_{name} {help_}", f"# TYPE jaxspec_{name} {kind}"]
            for labels, value in sorted(rows.items()):
                if labels and "=" not in labels:
                    labels = f'tenant="{labels}"'
                lines.append(
                    f"jaxspec_{name}{{{labels}}} {value}" if labels else f"jaxspec_{name} {value}"
                )
        return "\n".join(lines) + "\n"


async def serve_metrics(service: VerifierService, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP endpoint: any GET answers the Prometheus text of `service`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            body = service.prometheus().encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


def message_limit(vocab: int, max_gamma: int, prompt_len: int) -> int:
    """The largest valid message (a full-q block, or the longest prompt), with headroom."""
    block = max_gamma * (vocab * 4 + 16) + 256
    return 2 * max(block, prompt_len * 10 + 256)


@dataclasses.dataclass
class Server:
    """A running service: the grpc server, its servicer, health, and the bound ports."""

    grpc_server: Any
    service: VerifierService
    health: Any
    port: int
    metrics_server: asyncio.Server | None = None
    metrics_port: int | None = None
    _tasks: list[asyncio.Task] = dataclasses.field(default_factory=list)

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
        for t in self._tasks:
            t.cancel()
        if self.metrics_server is not None:
            self.metrics_server.close()
        await self.grpc_server.stop(grace)
        await self.service.verifier.aclose()


async def start(
    verifier: LocalVerifier,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tenants: Tenants | None = None,
    tls: tuple[bytes, bytes] | None = None,
    reflection: bool = False,
    metrics_port: int | None = None,
    evict_every_s: float = 5.0,
) -> Server:
    """Start serving `verifier` on host:port (0 picks a free port) and return the `Server`."""
    tenants = tenants or Tenants(None)
    sch = verifier.scheduler
    limit = message_limit(sch.vocab, sch.max_gamma, sch.max_len)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    service = VerifierService(verifier, tenants)
    pb_grpc.add_VerifierServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if reflection:
        from grpc_reflection.v1alpha import reflection as refl

        names = (pb.DESCRIPTOR.services_by_name["Verifier"].full_name, health.SERVICE_NAME)
        refl.enable_server_reflection((*names, refl.SERVICE_NAME), server)
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        key, cert = tls
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    out = Server(server, service, health_servicer, bound)
    if metrics_port is not None:
        out.metrics_server = await serve_metrics(service, host, metrics_port)
        out.metrics_port = out.metrics_server.sockets[0].getsockname()[1]

    async def evict() -> None:
        while True:
            await asyncio.sleep(evict_every_s)
            await verifier.evict_idle()

    out._tasks.append(asyncio.ensure_future(evict()))
    return out
