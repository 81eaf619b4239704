"""`LocalVerifier`: the scheduler behind the core's `VerifierEndpoint`, in-process
(docs/design.md §4).

Callers (the edge session, the demo, benchmarks, tests) await `verify(block)`; a single
worker task runs `Scheduler.tick()` in a thread whenever work is queued, so every block that
is ready at that moment shares one batch, and resolves each caller's future. The event loop
never waits for the scheduler's lock (a step holds it for the step's time): a block is
checked at once (`Scheduler.check`, refused as `submit` would) and goes into an inbox,
submitted in order by whatever takes the lock next; opens and closes take it in a worker
thread.
`for_tenant(name)` gives a `TenantEndpoint`: the same verifier acting as that tenant (what
the gRPC servicer hands each caller).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import jax

from jaxspec.nn.model import Model
from jaxspec.protocol import DraftBlock, SessionConfig, SessionInfo, VerifyResult
from verify.scheduler import Scheduler, SchedulerConfig


class LocalVerifier:
    """An asyncio `VerifierEndpoint` over a `Scheduler`, as the tenant `tenant` unless a
    call names another (`for_tenant` gives an endpoint that does)."""

    def __init__(
        self,
        model: Model | None = None,
        config: SchedulerConfig | None = None,
        *,
        scheduler: Scheduler | None = None,
        mesh: Any = None,
        tenant: str = "default",
    ):
        if scheduler is None:
            if model is None or config is None:
                raise ValueError("give a model and a SchedulerConfig, or a scheduler")
            scheduler = Scheduler(model, config, mesh=mesh)
        elif model is not None or config is not None or mesh is not None:
            raise ValueError("give a model and a SchedulerConfig, or a scheduler, not both")
        self.scheduler = scheduler
        # Called as fn(step seconds, live rows) after every verify step (e.g. metrics).
        self.step_observers: list[Callable[[float, int], None]] = []
        self.tenant = tenant
        # JAX config contexts are per thread and ticks run in a worker thread: they take
        # the x64 setting in force where the verifier was made (e.g. `jax.enable_x64()`).
        self._x64 = bool(jax.config.jax_enable_x64)
        self._lock = threading.Lock()
        self._futures: dict[int, asyncio.Future[VerifyResult]] = {}
        # Blocks not yet submitted, in the order `verify` was called (its own short lock).
        self._inbox: list[tuple[DraftBlock, str, asyncio.Future[VerifyResult]]] = []
        self._inbox_lock = threading.Lock()
        self._background: set[asyncio.Task] = set()  # closes of sessions nobody heard of
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    def for_tenant(self, tenant: str) -> TenantEndpoint:
        """This verifier acting as `tenant`: a `VerifierEndpoint` whose sessions are that
        tenant's (the same scheduler, worker and waiting callers as this one)."""
        return TenantEndpoint(self, tenant)

    def precompile(self, shape: tuple[str, int, int, int]) -> None:
        """Compile one of the scheduler's `warmup_shapes` ahead of time while this verifier
        serves (from a worker thread): the shape's arguments are read under the lock that
        steps take (a snapshot of the state's shapes), the compilation runs without it, so
        steps go on meanwhile. Nothing runs and no state changes."""
        with self._lock:
            fn, fn_args = self.scheduler.precompile_args(shape)
        self.scheduler.precompile(fn, fn_args)

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                # read without the lock (a step may hold it): a copy, and only this task ticks
                sessions = list(self.scheduler.sessions.values())
                busy = bool(self._inbox) or any(s.queue or not s.ready_to_verify for s in sessions)
                if not busy:
                    break
                steps = self.scheduler.metrics.steps
                try:
                    results, refused = await loop.run_in_executor(
                        None, self._locked, self.scheduler.tick
                    )
                except Exception as e:  # a bug of ours: fail every waiting caller, loudly
                    for fut in list(self._futures.values()):
                        if not fut.done():
                            fut.set_exception(e)
                    self._futures.clear()
                    raise
                self._refuse(refused)
                self._resolve(results)
                m = self.scheduler.metrics
                if m.steps > steps:
                    for observe in self.step_observers:
                        observe(m.last_step_s, m.last_rows)

    def _locked(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, list]:
        """`fn(*args)` under the scheduler's lock (in a worker thread), the blocks in the
        inbox submitted first: (its result, the blocks the scheduler refused, with why)."""
        with self._lock, jax.enable_x64(self._x64):
            with self._inbox_lock:
                inbox, self._inbox = self._inbox, []
            refused, failed = [], {}
            for block, tenant, fut in inbox:
                try:  # checked as it came: only a change since (a close, an eviction) fails
                    if block.session_id in failed:  # none after a refused one is committed
                        raise failed[block.session_id]
                    self._futures[self.scheduler.submit(block, tenant)] = fut
                except Exception as e:  # the caller's error (InvalidArgument, NotFound, ...)
                    failed[block.session_id] = e
                    refused.append((fut, e))
            return fn(*args), refused

    async def _call(
        self, fn: Callable[..., Any], *args: Any, then: Callable[[Any], None] | None = None
    ) -> Any:
        """`fn(*args)` under the lock, off the event loop; refused blocks told why. A caller
        cancelled meanwhile does not undo it: `then(result)` hears it when it is done (what
        the caller would have done with it: close an opened session, resolve results)."""
        task = asyncio.ensure_future(asyncio.to_thread(self._locked, fn, *args))
        try:
            out, refused = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._late(t, then))
            raise
        self._refuse(refused)
        return out

    def _late(self, task: asyncio.Future, then: Callable[[Any], None] | None) -> None:
        """What a cancelled `_call` still owes once its call is done."""
        if task.cancelled() or task.exception() is not None:
            return
        out, refused = task.result()
        self._refuse(refused)
        if then is not None:
            then(out)

    def _close_later(self, session_id: str, tenant: str) -> None:
        """Close a session whose opener went away before hearing of it."""
        task = asyncio.ensure_future(self.close_session(session_id, tenant=tenant))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _refuse(refused: list) -> None:
        for fut, e in refused:
            if not fut.done():
                fut.set_exception(e)

    def _resolve(self, results: list[tuple[int, VerifyResult]]) -> None:
        for ticket, res in results:
            fut = self._futures.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(res)

    async def open_session(
        self, config: SessionConfig, *, tenant: str | None = None
    ) -> SessionInfo:
        """Open a session for `tenant` (this verifier's own tenant when None)."""
        tenant = self.tenant if tenant is None else tenant
        info = await self._call(
            self.scheduler.open, config, tenant,
            then=lambda late: self._close_later(late.session_id, tenant),
        )  # fmt: skip
        self._ensure_worker()
        self._wake.set()  # start the prefill now
        return info

    async def verify(self, block: DraftBlock, *, tenant: str | None = None) -> VerifyResult:
        """The block's result, once a step has verified it (the block is queued before the
        first await, so blocks submitted one after the other keep their order); the
        scheduler's refusal (InvalidArgument, NotFound, ResourceExhausted, ...) raised."""
        self._ensure_worker()
        tenant = self.tenant if tenant is None else tenant
        fut = asyncio.get_running_loop().create_future()
        with self._inbox_lock:  # refused here, at once, as `submit` would (not the lock's wait)
            mine = sum(b.session_id == block.session_id for b, _, _ in self._inbox)
            self.scheduler.check(block, tenant, waiting=mine, everyone=len(self._inbox))
            self._inbox.append((block, tenant, fut))
        self._wake.set()
        return await fut

    async def close_session(self, session_id: str, *, tenant: str | None = None) -> None:
        """Close `tenant`'s session (NotFound for an unknown id or another tenant's)."""
        tenant = self.tenant if tenant is None else tenant
        call = self._call(self.scheduler.close, session_id, tenant, then=self._resolve)
        self._resolve(await call)

    async def evict_idle(self) -> None:
        """Drop sessions idle past the scheduler's timeout (their waiting blocks go stale)."""
        self._resolve(await self._call(self.scheduler.evict_idle, then=self._resolve))

    async def aclose(self) -> None:
        """Stop the worker task."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None


class TenantEndpoint:
    """A `VerifierEndpoint` that is `verifier` acting as `tenant` (`LocalVerifier.for_tenant`):
    each call goes to the shared verifier with this tenant named, so every tenant's blocks
    share its worker and its batches, and a tenant sees only its own sessions. The gRPC
    servicer hands one to each authenticated caller."""

    def __init__(self, verifier: LocalVerifier, tenant: str):
        self.verifier = verifier
        self.tenant = tenant

    @property
    def scheduler(self) -> Scheduler:
        """The shared verifier's scheduler."""
        return self.verifier.scheduler

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        return await self.verifier.open_session(config, tenant=self.tenant)

    async def verify(self, block: DraftBlock) -> VerifyResult:
        return await self.verifier.verify(block, tenant=self.tenant)

    async def close_session(self, session_id: str) -> None:
        await self.verifier.close_session(session_id, tenant=self.tenant)
