"""`LocalVerifier`: the scheduler behind the core's `VerifierEndpoint`, in-process
(docs/design.md §4).

Callers (the edge session, the demo, benchmarks, tests) await `verify(block)`; a single
worker task runs `Scheduler.tick()` in a thread whenever work is queued, so every block that
is ready at that moment shares one batch, and resolves each caller's future.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import jax

from jaxspec.model import Model
from jaxspec.protocol import DraftBlock, SessionConfig, SessionInfo, VerifyResult
from verify.scheduler import Scheduler, SchedulerConfig


class LocalVerifier:
    """An asyncio `VerifierEndpoint` over a `Scheduler` (one tenant identity per instance
    unless `tenant` is given per call)."""

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
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    def for_tenant(self, tenant: str) -> LocalVerifier:
        """A view of the same verifier that acts as another tenant."""
        view = LocalVerifier(scheduler=self.scheduler, tenant=tenant)
        view._x64 = self._x64
        view._lock, view._futures = self._lock, self._futures
        view.step_observers = self.step_observers
        view._shared = self
        return view

    def _root(self) -> LocalVerifier:
        return getattr(self, "_shared", self)

    def _ensure_worker(self) -> None:
        root = self._root()
        if root._worker is None or root._worker.done():
            root._wake = asyncio.Event()
            root._worker = asyncio.get_running_loop().create_task(root._run())

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    busy = self.scheduler.pending() > 0 or any(
                        not s.ready_to_verify for s in self.scheduler.sessions.values()
                    )
                if not busy:
                    break
                steps = self.scheduler.metrics.steps
                try:
                    results = await loop.run_in_executor(None, self._tick)
                except Exception as e:  # a bug of ours: fail every waiting caller, loudly
                    for fut in self._futures.values():
                        if not fut.done():
                            fut.set_exception(e)
                    self._futures.clear()
                    raise
                self._resolve(results)
                m = self.scheduler.metrics
                if m.steps > steps:
                    for observe in self.step_observers:
                        observe(m.last_step_s, m.last_rows)

    def _tick(self) -> list[tuple[int, VerifyResult]]:
        with self._lock, jax.enable_x64(self._x64):
            return self.scheduler.tick()

    def _resolve(self, results: list[tuple[int, VerifyResult]]) -> None:
        for ticket, res in results:
            fut = self._futures.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(res)

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        with self._lock:
            info = self.scheduler.open(config, self.tenant)
        self._ensure_worker()
        self._root()._wake.set()  # start the prefill now
        return info

    async def verify(self, block: DraftBlock) -> VerifyResult:
        self._ensure_worker()
        with self._lock:
            ticket = self.scheduler.submit(block, self.tenant)
            fut = asyncio.get_running_loop().create_future()
            self._futures[ticket] = fut
        self._root()._wake.set()
        return await fut

    async def close_session(self, session_id: str) -> None:
        with self._lock:
            results = self.scheduler.close(session_id, self.tenant)
        self._resolve(results)

    async def evict_idle(self) -> None:
        """Drop sessions idle past the scheduler's timeout (their waiting blocks go stale)."""
        with self._lock:
            results = self.scheduler.evict_idle()
        self._resolve(results)

    async def aclose(self) -> None:
        """Stop the worker task."""
        root = self._root()
        if root._worker is not None:
            root._worker.cancel()
            try:
                await root._worker
            except (asyncio.CancelledError, Exception):
                pass
            root._worker = None
