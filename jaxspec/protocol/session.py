"""A session's messages: what `OpenSession` carries (`SessionConfig`) and answers
(`SessionInfo`), the verifier's answer to one block (`VerifyResult`), and the
`VerifierEndpoint` protocol that `verify` implements and `edge` consumes."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol.blocks import DraftBlock
from jaxspec.protocol.settings import DraftSpec, SamplingSettings


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """What `OpenSession` carries. `sampling` applies to the target and the draft alike."""

    prompt: tuple[int, ...]
    max_new_tokens: int = 64
    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    seed: int = 0
    mode: str = "sync"  # "sync" | "pipelined"
    draft: DraftSpec = DraftSpec()  # noqa: RUF009 (a frozen dataclass: one shared default is safe)
    stop_tokens: tuple[int, ...] | None = None  # None: the target's EOS ids
    # Resume: new tokens already committed by a verifier that went away. Draws are keyed
    # by position, so the reopened session continues exactly where the old one stopped.
    committed: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """The verifier's answer to OpenSession: the session's id and what it took: `gamma` (the
    drafts its blocks carry at most), the sparse-q and vocabulary limits, max_new_tokens."""

    session_id: str
    gamma: int
    max_sparse_k: int
    vocab_size: int
    max_new_tokens: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """The verifier's answer to one block.

    accepted: drafts accepted; tokens: the committed tokens this block added (accepted
    drafts, then the correction or bonus, cut at a stop token / max_new_tokens);
    next_token: the correction or bonus (None when none was emitted); new_epoch: the
    session's epoch after this block (epoch + 1 after a rejection); stale: the block was
    dropped (old epoch or start != committed length) and changed nothing; figures: the
    session's acceptance totals after this block (`AcceptanceFigures`, every result alike).
    """

    epoch: int
    start: int
    accepted: int = 0
    tokens: tuple[int, ...] = ()
    next_token: int | None = None
    new_epoch: int = 0
    stale: bool = False
    finished: bool = False
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)
    # The verify step that answered this block (0: stale): a measurement, not part of what
    # the result says, so it takes no part in equality.
    step_s: float = dataclasses.field(default=0.0, compare=False)


@runtime_checkable
class VerifierEndpoint(Protocol):
    """Open a session, verify blocks (several may be in flight), close it."""

    async def open_session(self, config: SessionConfig) -> SessionInfo: ...

    async def verify(self, block: DraftBlock) -> VerifyResult: ...

    async def close_session(self, session_id: str) -> None: ...
