"""`DelayedEndpoint`: a simulated WAN link in front of any `VerifierEndpoint`.

The benchmarks, the demo and the tests run the edge session and the verifier in one process;
this wrapper puts a network between them: one-way delays with jitter (or a scripted list of
delays), each direction FIFO like a stream over TCP. It changes when answers arrive, never
what they are, so a session's tokens through it equal a direct run's (docs/design.md §3).
"""

from __future__ import annotations

import asyncio
import random

from jaxspec.protocol import DraftBlock, SessionConfig, SessionInfo, VerifierEndpoint, VerifyResult


class DelayedEndpoint:
    """Wraps an endpoint with one-way delays (seconds) and jitter, like a WAN link. Each
    direction stays FIFO (a stream over TCP): a message arrives after its own delay and never
    before the message sent ahead of it. `delays` scripts the delays (tests); after the
    script runs out, `one_way_s +- jitter_s` (uniform, seeded) applies."""

    def __init__(
        self,
        inner: VerifierEndpoint,
        one_way_s: float = 0.0,
        jitter_s: float = 0.0,
        seed: int = 0,
        delays: list[float] | None = None,
    ):
        self.inner = inner
        self.one_way_s = one_way_s
        self.jitter_s = jitter_s
        self._rng = random.Random(seed)
        self._script = list(delays or [])
        self._tail: dict[str, asyncio.Future[None] | None] = {"up": None, "down": None}

    def _delay(self) -> float:
        if self._script:
            return self._script.pop(0)
        return max(0.0, self.one_way_s + self._rng.uniform(-1, 1) * self.jitter_s)

    async def _cross(self, direction: str) -> None:
        """Return when this message arrives. The caller must deliver it before its next
        await: the next message's wake-up is only scheduled, it cannot overtake."""
        prev = self._tail[direction]
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tail[direction] = mine
        try:
            await asyncio.sleep(self._delay())
            if prev is not None:
                await asyncio.shield(prev)  # our cancel must not cancel the one ahead
        finally:
            # Arrived, or cancelled in flight: either way the next message may go once the
            # one ahead of us has (a lost message must not stall the link forever).
            if prev is None or prev.done():
                if not mine.done():
                    mine.set_result(None)
            else:
                prev.add_done_callback(lambda _: mine.done() or mine.set_result(None))

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        await self._cross("up")
        info = await self.inner.open_session(config)
        await self._cross("down")
        return info

    async def verify(self, block: DraftBlock) -> VerifyResult:
        await self._cross("up")
        r = await self.inner.verify(block)  # queued before any later message can run
        await self._cross("down")
        return r

    async def close_session(self, session_id: str) -> None:
        await self.inner.close_session(session_id)
