"""`VerifierService`: the `jaxspec.v1.Verifier` gRPC servicer over `LocalVerifier`
(docs/design.md §4).

    caller --Bearer token--> tenant --> OpenSession / Verify stream / CloseSession / Stats
                                           |
                              LocalVerifier (one scheduler, one batched step per tick)

Every RPC authenticates first (no state is created for an unknown caller); every protocol
error leaves as its own status (`jaxspec.protocol` names it), never UNKNOWN. A Verify stream
carries one session, and a session has one live stream at a time (a second one is
FAILED_PRECONDITION, the first goes on). The stream's first message opens its session (`open`,
what a client behind a load balancer does: the session then lives on the one replica the
stream reached) or names one that OpenSession opened; blocks are answered in order; a client
that goes away (cancel, disconnect, deadline) frees its session's slot. Setting `draining` stops
taking sessions and blocks; what was taken is answered, then every stream ends with
UNAVAILABLE so clients resume elsewhere — with exactly the tokens they would have had,
because draws are keyed by position.
Until a verifier is attached (`attach`, once the target is loaded and warmed up) every RPC but
Stats answers UNAVAILABLE "warming up"; Stats answers then too, with how far the warm-up is
(`warming_done` of `warming_total` shapes, `warming_progress`). Closing a session that its
tenant had and that is closed already (its stream ended, it was evicted, or closed before)
answers OK: a normal end, not a refusal. Start-up, health and the drain's timing are
`verify.serve`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import grpc

from jaxspec.figures import AcceptanceFigures
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SessionInfo,
    Unavailable,
    VerifierError,
    wire,
)
from verify.local import LocalVerifier
from verify.metrics import ServiceMetrics
from verify.tenants import RateLimits, Tenant, Tenants, authorization_headers

log = logging.getLogger(__name__)

# A Verify stream reads at most this many blocks ahead of its answers (stale ones included;
# above the scheduler's 8 blocks in flight a session may have): at the bound it stops reading,
# and HTTP/2 flow control pushes back on the client. A client that does not read its answers
# thus holds a bounded amount of the server's memory.
MAX_UNANSWERED = 16
# A stream whose next answer cannot be written (the client reads none) for this long is ended
# RESOURCE_EXHAUSTED and its session closed (--write-timeout-s).
WRITE_TIMEOUT_S = 30.0
# A Verify stream whose first message (its `open`, or a block naming its session) has not
# come this long is ended DEADLINE_EXCEEDED (--first-message-timeout-s): before it has one, a
# stream has no session, so no idle eviction ends it (2,000 silent streams stayed 150 s).
FIRST_MESSAGE_TIMEOUT_S = 30.0

WARMING_UP = (
    "the verifier is warming up (loading the target, compiling its batch shapes): "
    "retry when grpc.health.v1 says SERVING"
)

# The figures the Stats RPC carries (`stats()` has more, for the Prometheus gauges).
_STATS_FIELDS = tuple(pb.StatsResponse.DESCRIPTOR.fields_by_name)


class WriteTimeout(ResourceExhausted):
    """A Verify stream's client read no answer for the write timeout."""


class CallGone(Exception):
    """A Verify stream's call is over at gRPC's core: a write failed (`ExecuteBatchError`)
    because the client reset the stream or its connection closed, before gRPC's own
    cancellation of the handler came. Nobody is left to read an answer or a status."""


class Undecodable:
    """The stand-in for a request whose bytes are not a `message` (what `add_to_server`'s
    deserializers give instead of raising): the handler answers INVALID_ARGUMENT after
    authentication, where a raising deserializer would answer UNKNOWN with a traceback."""

    def __init__(self, message: str):
        self.message = message


def _tolerant(message_type: Any) -> Any:
    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception:  # DecodeError, or anything else protobuf raises on bad bytes
            return Undecodable(message_type.DESCRIPTOR.name)

    return decode


def add_to_server(service: VerifierService, server: Any) -> None:
    """Register `service` as `jaxspec.v1.Verifier` on `server`, like the generated
    `add_VerifierServicer_to_server` but with deserializers that never raise (`Undecodable`)."""
    rpcs = (  # name, kind, request type, response type
        ("OpenSession", grpc.unary_unary_rpc_method_handler, pb.OpenSessionRequest,
         pb.OpenSessionResponse),
        ("Verify", grpc.stream_stream_rpc_method_handler, pb.VerifyRequest, pb.VerifyResponse),
        ("CloseSession", grpc.unary_unary_rpc_method_handler, pb.CloseSessionRequest,
         pb.CloseSessionResponse),
        ("Stats", grpc.unary_unary_rpc_method_handler, pb.StatsRequest, pb.StatsResponse),
    )  # fmt: skip
    handlers = {
        name: kind(
            getattr(service, name),
            request_deserializer=_tolerant(request),
            response_serializer=response.SerializeToString,
        )
        for name, kind, request, response in rpcs
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("jaxspec.v1.Verifier", handlers),)
    )
    server.add_registered_method_handlers("jaxspec.v1.Verifier", handlers)


class VerifierService(pb_grpc.VerifierServicer):
    """The `jaxspec.v1.Verifier` servicer; `tenants` does the auth, `metrics` (its own
    Prometheus registry, its rows histogram over `row_buckets`) counts what happens, and the
    verifier given to `attach` does the work (None until then: warming up)."""

    def __init__(
        self,
        tenants: Tenants,
        row_buckets: Sequence[int],
        *,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        max_unanswered: int = MAX_UNANSWERED,
        first_message_timeout_s: float = FIRST_MESSAGE_TIMEOUT_S,
        vocab_size: int = 0,
    ):
        if not write_timeout_s > 0 or not first_message_timeout_s > 0 or max_unanswered < 1:
            raise ValueError(
                "write_timeout_s and first_message_timeout_s must be > 0, max_unanswered >= 1"
            )
        self.write_timeout_s = write_timeout_s
        self.first_message_timeout_s = first_message_timeout_s
        self.max_unanswered = max_unanswered
        self.vocab_size = vocab_size  # the target's (Stats), 0: not said
        self.verifier: LocalVerifier | None = None
        self.tenants = tenants
        self.rate_limits = RateLimits()
        self.row_buckets = tuple(row_buckets)
        self.metrics = ServiceMetrics(self.stats, self.row_buckets)
        self.draining = asyncio.Event()
        self.streams = 0
        self.ending: set[asyncio.Future] = set()  # streams' ends in progress (`VerifyStream._end`)
        self.bound: set[str] = set()  # the sessions that have a live Verify stream (one each)
        self.answered_draining = 0  # blocks answered while draining
        self.unanswered_draining = 0  # taken, then the stream ended in the drain: must stay 0
        self.warming = (0, 0)  # (shapes compiled, shapes to compile): Stats' warming_*

    def attach(self, verifier: LocalVerifier) -> None:
        """Start answering with `verifier` (loaded and warmed up): the end of warming up."""
        if tuple(verifier.scheduler.config.row_buckets) != self.row_buckets:
            raise ValueError("the verifier's row buckets are not the metrics' row buckets")
        verifier.step_observers.append(self.metrics.observe_step)
        self.verifier = verifier

    def warming_progress(self, done: int, total: int) -> None:
        """Record the warm-up's count (`done` of `total` batch shapes compiled), what Stats
        answers as `warming_done`/`warming_total` — while warming up too, so a waiting client
        can show how far it is. Called from the warm-up's worker thread (one tuple, replaced
        whole)."""
        if not 0 <= done <= total:
            raise ValueError(f"warm-up progress must be 0 <= done <= total, got {done}/{total}")
        self.warming = (done, total)

    # ---- helpers -------------------------------------------------------------------------

    async def reject(self, context: Any, method: str, code: str, message: str) -> None:
        """End the RPC `method` with the status `code` (a `grpc.StatusCode` name) and
        `message`, counted in `jaxspec_rejected_requests_total`: raises (`context.abort`),
        never returns. Every refusal of the service goes through here, a Verify stream's too,
        so the count is complete."""
        self.metrics.rejected.labels(method, code).inc()
        await context.abort(grpc.StatusCode[code], message)

    async def _auth(self, context: Any, method: str) -> Tenant:
        metadata = context.invocation_metadata()
        tenant = self.tenants.identify(metadata)
        if tenant is None:
            n = authorization_headers(metadata)
            why = f"{n} authorization headers (send exactly one)" if n > 1 else ""
            await self.reject(context, method, "UNAUTHENTICATED", why or "missing or invalid token")
        return tenant

    async def _decoded(self, request: Any, context: Any, method: str) -> None:
        """INVALID_ARGUMENT for a request whose bytes did not decode (after `_auth`)."""
        if isinstance(request, Undecodable):
            await self.reject(
                context, method, "INVALID_ARGUMENT", f"the request is not a {request.message}"
            )

    async def _ready(self, context: Any, method: str) -> LocalVerifier:
        """The verifier, or UNAVAILABLE while warming up."""
        if self.verifier is None:
            await self.reject(context, method, "UNAVAILABLE", WARMING_UP)
        return self.verifier

    async def _admit(self, request: Any, context: Any, method: str) -> tuple[Tenant, LocalVerifier]:
        """A unary RPC's gate, in order: the caller's tenant (`_auth`), the request decoded
        (`_decoded`), the verifier serving (`_ready`)."""
        tenant = await self._auth(context, method)
        await self._decoded(request, context, method)
        return tenant, await self._ready(context, method)

    @staticmethod
    def _live_sessions(verifier: LocalVerifier, tenant: str) -> int:
        return sum(s.tenant == tenant for s in list(verifier.scheduler.sessions.values()))

    # ---- RPCs ----------------------------------------------------------------------------

    async def OpenSession(
        self, request: pb.OpenSessionRequest, context: Any
    ) -> pb.OpenSessionResponse:
        tenant, verifier = await self._admit(request, context, "OpenSession")
        try:
            info = await self.open_session(verifier, tenant, request)
        except VerifierError as e:
            await self.reject(context, "OpenSession", e.code, str(e))
        return wire.info_to_proto(info)

    async def open_session(
        self, verifier: LocalVerifier, tenant: Tenant, request: pb.OpenSessionRequest
    ) -> SessionInfo:
        """Open a session for `tenant` (OpenSession, or a Verify stream's `open`): the
        `SessionInfo`, or the protocol error (draining, the tenant's limit, a bad config)."""
        if self.draining.is_set():
            raise Unavailable("the verifier is draining")
        if self._live_sessions(verifier, tenant.name) >= tenant.max_sessions:
            raise ResourceExhausted(f"tenant limit of {tenant.max_sessions} live sessions")
        config = wire.config_from_proto(request)
        info = await verifier.for_tenant(tenant.name).open_session(config)
        self.metrics.sessions_opened.labels(tenant.name).inc()
        return info

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Any
    ) -> pb.CloseSessionResponse:
        tenant, verifier = await self._admit(request, context, "CloseSession")
        try:
            await verifier.for_tenant(tenant.name).close_session(request.session_id)
        except NotFound as e:
            # Closed already — its stream ended, it was evicted, or a second close: the
            # session is closed as asked, so OK (and no refusal counted). An unknown id, or
            # another tenant's, is NOT_FOUND, alike.
            if not verifier.scheduler.closed_recently(request.session_id, tenant.name):
                await self.reject(context, "CloseSession", e.code, str(e))
        except VerifierError as e:
            await self.reject(context, "CloseSession", e.code, str(e))
        return pb.CloseSessionResponse()

    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        tenant = await self._auth(context, "Stats")
        await self._decoded(request, context, "Stats")
        figures = self.stats(None if tenant.admin else tenant.name)
        return pb.StatsResponse(**{k: figures[k] for k in _STATS_FIELDS})

    def stats(self, tenant: str | None = None) -> dict[str, Any]:
        """The scheduler's figures (the Stats RPC, and the metrics' gauges at scrape time,
        from another thread: the session table is copied before it is read); all zero, not
        serving, while warming up (but for the warm-up's count, `warming_progress`, which
        every caller sees: it tells of no tenant). With `tenant` (a Stats caller that is not
        an admin) only that tenant's own: its sessions, queued blocks, the steps that carried
        its blocks and the tokens committed to it; the verifier-wide step figures (last step
        time, rows, occupancy) are 0, since they tell of other tenants' load."""
        warming = dict(zip(("warming_done", "warming_total"), self.warming, strict=True))
        warming["vocab_size"] = self.vocab_size  # tells of no tenant either
        if self.verifier is None:
            return dict(
                sessions=0, queued_blocks=0, steps=0, last_step_s=0.0, last_rows=0,
                last_bucket_rows=0, mean_occupancy=0.0, tokens_committed=0, serving=False,
            ) | warming  # fmt: skip
        sch = self.verifier.scheduler
        m = sch.metrics
        sessions = list(sch.sessions.values())
        if tenant is not None:
            own = [s for s in sessions if s.tenant == tenant]
            return dict(
                sessions=len(own), queued_blocks=sum(len(s.queue) for s in own),
                steps=sch.tenant_steps[tenant], last_step_s=0.0, last_rows=0,
                last_bucket_rows=0, mean_occupancy=0.0,
                tokens_committed=sch.tenant_committed[tenant],
                serving=not self.draining.is_set(),
            ) | warming  # fmt: skip
        return dict(
            sessions=len(sessions),
            queued_blocks=sum(len(s.queue) for s in sessions),
            steps=m.steps,
            last_step_s=m.last_step_s,
            last_rows=m.last_rows,
            last_bucket_rows=m.last_bucket_rows,
            mean_occupancy=m.mean_occupancy,
            tokens_committed=m.tokens_committed,
            serving=not self.draining.is_set(),
            kv_padding=m.kv_padding,  # metrics only (not in StatsResponse)
            **warming,
        )

    async def Verify(self, request_iterator: AsyncIterator[pb.DraftBlock], context: Any) -> None:
        """One session: opened by the first message (or named by it), then blocks up,
        results down in order (`VerifyStream`, after authentication). Errors end the stream
        with their status after every earlier block's result (a session from OpenSession
        stays for a new stream, one the stream opened is closed with it); the end of the
        stream — half-close, cancel, a vanished client — closes the session. At most
        `max_unanswered` blocks are read ahead of their answers; an answer the client does
        not read for `write_timeout_s` ends the stream (RESOURCE_EXHAUSTED) and closes its
        session whoever opened it. Every task started here is awaited or cancelled before
        the handler returns; only the end's own task (the session's close, shielded from
        the handler's cancellation) may finish just after it."""
        tenant = await self._auth(context, "Verify")
        verifier = await self._ready(context, "Verify")
        await VerifyStream(self, verifier, tenant, context).run(request_iterator)


class VerifyStream:
    """One Verify stream of `service` for `tenant`: its state, and the two tasks that share
    it. The reader (`_read`) takes the client's messages — the `open`, or the first block
    naming a session; then blocks, each submitted to the verifier as a task of its own in the
    order read — and queues each on `items`; the handler's own task (`_answer_all`) writes
    the answers in that order. `room` holds one permit per block read and not yet answered:
    without one the reader reads nothing more (gRPC core then stops opening the stream's
    flow-control window). `_end` runs once, before any status is sent."""

    def __init__(
        self, service: VerifierService, verifier: LocalVerifier, tenant: Tenant, context: Any
    ):
        self.service = service
        self.verifier = verifier
        self.tenant = tenant
        self.context = context
        self.endpoint = verifier.for_tenant(tenant.name)
        # (block, received at, future of its result), ("opened", info), an error, or None
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.room = asyncio.Semaphore(service.max_unanswered)
        self.tasks: set[asyncio.Future] = set()  # the blocks' verify tasks
        self.session_id: str | None = None  # once known
        self.opened = False  # the session was opened by this stream: it ends with it
        self.failed = False  # a block of this stream failed: no later one reaches the scheduler
        self.taken_any = False  # a first message was read
        self.taken = 0  # blocks read and submitted
        self.answered = 0  # ... whose answers were written
        self.ended = False  # `_end` ran
        self.reader: asyncio.Future | None = None
        self.drain: asyncio.Future | None = None  # the service's draining event, awaited
        self.get: asyncio.Future | None = None  # the answer loop's wait for its next item

    async def run(self, requests: AsyncIterator[Any]) -> None:
        """The stream, from its response headers to its status (OK when it returns)."""
        # The response headers on their own (not flow-controlled, sent at once): an answer
        # that cannot be written then holds only its message, and the status can still be
        # sent after it (`_write`'s timeout; gRPC refuses a second headers operation).
        try:
            await self._send(self.context.send_initial_metadata(()))
        except CallGone:
            raise asyncio.CancelledError from None  # as gRPC's cancellation would end it
        self.reader = asyncio.ensure_future(self._read(requests))
        self.drain = asyncio.ensure_future(self.service.draining.wait())
        self.service.streams += 1
        try:
            await self._answer_all()
        except VerifierError as e:
            # from OpenSession: it stays, for another stream (not if its answers went unread)
            await self._end(keep=not self.opened and not isinstance(e, WriteTimeout))
            await self._fail(e)
        except CallGone:
            # The client went away while an answer was being written: end as gRPC's
            # cancellation (which had not reached this task yet) ends a stream, its session
            # closed and no status sent. Raised out of the handler, the write's own error
            # was logged by gRPC with a traceback whenever its cancellation came second.
            await self._end(keep=False)
            raise asyncio.CancelledError from None
        finally:
            await self._end(keep=False)

    @staticmethod
    async def _send(operation: Awaitable[None]) -> None:
        """Await one of gRPC's send operations; `CallGone` when the call is over."""
        try:
            await operation
        except grpc.aio.InternalError:  # ExecuteBatchError: the call is gone at the core
            raise CallGone() from None

    # ---- the reader ----------------------------------------------------------------------

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        """Take messages until the client half-closes; what ends the reading (the end, an
        error to send, a client gone) is queued last."""
        try:
            messages = aiter(requests)
            while True:
                await self.room.acquire()  # the permit of the block this message may be
                try:
                    msg = await (anext(messages) if self.taken_any else self._first(messages))
                except StopAsyncIteration:
                    break
                self.taken_any = True
                await self._take(msg)
            self.items.put_nowait(None)
        except VerifierError as e:
            self.items.put_nowait(e)
        except (grpc.RpcError, grpc.aio.BaseError):
            # the client went away (the writer sees the cancel), or the call is over
            # (aborted by the writer) while this task still read
            self.items.put_nowait(None)
        except Exception:  # a bug of ours: end the stream with INTERNAL, not a hang
            log.exception("reading a Verify stream")
            self.items.put_nowait(VerifierError("internal error reading the stream"))

    async def _first(self, messages: AsyncIterator[Any]) -> Any:
        """The stream's first message, or `DeadlineExceeded` when none comes within the
        first-message timeout (a stream without one has no session that could time out)."""
        timeout = self.service.first_message_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await anext(messages)
        except TimeoutError:
            raise DeadlineExceeded(
                f"no first message within {timeout:g} s: a Verify stream opens or names its "
                "session at once"
            ) from None

    async def _take(self, msg: Any) -> None:
        """One message: an `open` or a block (anything else is INVALID_ARGUMENT)."""
        if self.service.draining.is_set():
            raise Unavailable("the verifier is draining: resume the session")
        received = time.perf_counter()
        if isinstance(msg, Undecodable):
            raise InvalidArgument(f"a Verify message is not a {msg.message}")
        kind = msg.WhichOneof("kind")
        if kind == "open":
            await self._open(msg.open)
        elif kind == "block":
            await self._submit(msg.block, received)
        else:
            raise InvalidArgument("a Verify message holds neither open nor block")

    async def _open(self, request: pb.OpenSessionRequest) -> None:
        """Open the stream's session (its first message only); its answer is queued."""
        if self.session_id is not None:
            raise InvalidArgument("a Verify stream carries one session")
        info = await self.service.open_session(self.verifier, self.tenant, request)
        self.session_id = info.session_id
        self.opened = True
        self.service.bound.add(info.session_id)
        self.room.release()  # not a block
        self.items.put_nowait(("opened", info))

    async def _submit(self, message: pb.DraftBlock, received: float) -> None:
        """Submit a block of the stream's session (after the tenant's rate limit) as a task
        of its own, and queue it for its answer."""
        if self.session_id is not None and not message.session_id:
            message.session_id = self.session_id  # may be left out after the first
        block = wire.block_from_proto(message)
        self._bind(block.session_id)
        await self.service.rate_limits.take(self.tenant, len(block.tokens) + 1)
        fut = asyncio.ensure_future(self._verify(block))
        self.tasks.add(fut)
        self.taken += 1
        self.service.metrics.unanswered.inc()
        self.items.put_nowait((block, received, fut))

    def _bind(self, session_id: str) -> None:
        """The first block names the stream's session (the tenant's, with no other live
        stream); every later block must name the same one."""
        if self.session_id is None:
            self.endpoint.scheduler.get(session_id, self.tenant.name)  # NotFound
            if session_id in self.service.bound:
                raise FailedPrecondition("the session already has a stream")
            self.service.bound.add(session_id)
            self.session_id = session_id
        elif session_id != self.session_id:
            raise InvalidArgument("a Verify stream carries one session")

    async def _verify(self, block: Any) -> Any:
        """The block's result; None, never submitted, for a block read after one that
        failed (the stream ends with that failure, so nothing the client is not told
        about is committed). Blocks are submitted in the order they were read: tasks
        start in the order they were made, and submitting is their first, synchronous
        step."""
        if self.failed:
            return None
        try:
            return await self.endpoint.verify(block)
        except VerifierError:
            self.failed = True
            raise

    # ---- the answers ---------------------------------------------------------------------

    async def _answer_all(self) -> None:
        """Write what the reader queued, in order, until the end it queued (return) or an
        error (raised); draining stops the reading, and once what was taken is answered
        the stream ends UNAVAILABLE."""
        assert self.reader is not None and self.drain is not None
        while True:
            if self.items.empty() and self.drain.done() and self.reader.done():
                raise Unavailable("the verifier is draining: resume the session")
            self.get = asyncio.ensure_future(self.items.get())
            await asyncio.wait({self.get, self.drain}, return_when=asyncio.FIRST_COMPLETED)
            if not self.get.done():
                # Draining: stop reading; answer what was taken, then end the stream.
                self.get.cancel()
                self.reader.cancel()
                await asyncio.gather(self.reader, self.get, return_exceptions=True)
                continue
            item = self.get.result()
            if item is None:  # half-closed, or a vanished client seen as one
                return
            if isinstance(item, VerifierError):
                raise item
            if item[0] == "opened":
                await self._write(pb.VerifyResponse(opened=wire.info_to_proto(item[1])))
                continue
            await self._answer(*item)

    async def _answer(self, block: Any, received: float, fut: asyncio.Future) -> None:
        """Count the block's result and write it; its permit goes back to the reader."""
        res = await fut
        self.tasks.discard(fut)
        metrics = self.service.metrics
        if res.stale:
            metrics.count_stale(self.tenant.name)
        else:
            counted = AcceptanceFigures.of_round(len(block.tokens), res.accepted, len(res.tokens))
            metrics.count_round(self.tenant.name, counted)
        metrics.block_seconds.labels(self.tenant.name).observe(time.perf_counter() - received)
        result = wire.result_to_proto(res)
        if not self.tenant.admin:
            # The step's time grows with its batch mates, other tenants' sessions among them:
            # like Stats' step figures, only an admin (or the anonymous caller) sees it.
            result.step_s = 0.0
        await self._write(pb.VerifyResponse(result=result))
        self.service.answered_draining += self.service.draining.is_set()
        self.answered += 1
        metrics.unanswered.dec()
        self.room.release()

    async def _write(self, response: pb.VerifyResponse) -> None:
        """Send one answer: `WriteTimeout` when the client reads none for the timeout,
        `CallGone` when the call is over."""
        timeout = self.service.write_timeout_s
        try:
            await asyncio.wait_for(self._send(self.context.write(response)), timeout)
        except TimeoutError:
            raise WriteTimeout(
                f"the client read no answer for {timeout:g} s: stream ended, session closed"
            ) from None

    # ---- the end -------------------------------------------------------------------------

    async def _fail(self, e: VerifierError) -> None:
        """End the stream with `e`'s status."""
        try:
            await self.service.reject(self.context, "Verify", e.code, str(e))
        except grpc.aio.InternalError:
            # The call is over (gRPC's ExecuteBatchError): the status waited behind unread
            # answers and the client went away meanwhile, or the client reset the stream as
            # it failed. Nobody is left to tell; gRPC sees the abort, quietly.
            pass

    async def _end(self, keep: bool) -> None:
        """Once: stop reading, cancel and await every task of the stream, give the slot
        back unless `keep` (the stream failed on bad input: a session from OpenSession
        stays for another stream). Before any status is sent: a status waits behind
        answers the client has not read, maybe for ever.

        Cancellation-safe: the waiting and the close run in a task of their own that this
        call shields. gRPC cancels the handler when the client resets the stream, also
        after a half-close while this runs; a close behind an await that the cancellation
        interrupts was skipped, and the session outlived its stream until the idle
        eviction (about 1 stream in 150 of those ended half-close then cancel)."""
        if self.ended:
            return
        self.ended = True
        service = self.service
        if self.session_id is not None:
            service.bound.discard(self.session_id)
        service.streams -= 1
        pending = [t for t in (self.reader, self.drain, self.get, *self.tasks) if t is not None]
        for t in pending:  # blocks whose answers will never be sent among them
            t.cancel()
        settle = asyncio.ensure_future(self._settle(pending, keep))
        service.ending.add(settle)  # held until done, whatever happens to this call
        settle.add_done_callback(service.ending.discard)
        await asyncio.shield(settle)

    async def _settle(self, pending: list[asyncio.Future], keep: bool) -> None:
        """`_end`'s part that must run to its end: await the cancelled tasks, count what was
        left unanswered, close the session (unless `keep`)."""
        service = self.service
        await asyncio.gather(*pending, return_exceptions=True)
        service.metrics.unanswered.dec(self.taken - self.answered)
        if service.draining.is_set():
            service.unanswered_draining += self.taken - self.answered
        if not keep and self.session_id is not None:
            # Ended, cancelled, disconnected, past its deadline or drained (a killed client
            # can look like a half-close): nobody will send or read more, so the slot goes
            # back to the pool now.
            await self._close_session()

    async def _close_session(self) -> None:
        try:
            await self.endpoint.close_session(self.session_id)
        except NotFound:
            pass  # closed already (CloseSession, eviction, the other path here)
