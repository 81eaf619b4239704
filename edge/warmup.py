"""Compiling the drafter before its first real session, off the event loop.

A session's first draft, rollback and append steps compile on first use (seconds for the
tiny draft, 10-20 s each for SmolLM2's W4A16 copy on a CPU). Compiled inside the session,
that time is spent in the event loop's thread: a Ctrl-C cannot end the command until it is
over, and nothing else runs. `compile_drafter` runs a short session of each prompt length
against `StandIn`, a verifier stand-in that takes the same shapes, meant for a worker
thread (`jaxspec_host.worker.in_thread`); the real session then finds them compiled. The
drafter's state is per session, so the real output does not change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.protocol import DraftBlock, SessionConfig, SessionInfo, VerifyResult


class StandIn:
    """A verifier stand-in for compiling the drafter: it accepts every draft but the last,
    answers a correction and finishes after two rounds, so `run_session` traces the same
    draft/rollback/append shapes a real session will."""

    def __init__(self) -> None:
        self.rounds = 0

    async def open_session(self, config: SessionConfig) -> SessionInfo:
        return SessionInfo(
            session_id="warmup",
            gamma=config.draft.gamma,
            max_sparse_k=0,
            vocab_size=0,
            max_new_tokens=config.max_new_tokens,
        )

    async def verify(self, block: DraftBlock) -> VerifyResult:
        self.rounds += 1
        a = len(block.tokens) - 1
        return VerifyResult(
            epoch=block.epoch,
            start=block.start,
            accepted=a,
            tokens=(*block.tokens[:a], block.tokens[0]),
            next_token=block.tokens[0],
            new_epoch=block.epoch + 1,
            stale=False,
            finished=self.rounds >= 2,
        )

    async def close_session(self, session_id: str) -> None:
        pass


def compile_drafter(drafter: Drafter, configs: Sequence[SessionConfig], depth: int) -> None:
    """Run a session of each prompt length once against the stand-in, with its own event
    loop (call it in a worker thread): every shape these sessions use is compiled."""
    for cfg in {len(cfg.prompt): cfg for cfg in configs}.values():
        asyncio.run(run_session(StandIn(), drafter, cfg, depth=depth))
