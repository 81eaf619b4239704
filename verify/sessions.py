"""What the scheduler keeps per session (`Session`: its slot, tokens, queue and figures) and
over all its steps (`Metrics`), and the per-row arrays of a batch of sessions' blocks
(`row_arrays`)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import DraftBlock, SessionConfig


@dataclasses.dataclass
class Session:
    """One open session: its slot in the KV pool, its tokens (prompt + committed), what of
    its context is prefilled, its epoch and its queue of (ticket, block) not yet verified."""

    id: str
    tenant: str
    config: SessionConfig
    slot: int
    tokens: list[int]  # prompt + committed new tokens
    prompt_len: int
    stops: frozenset[int]
    key: np.ndarray
    penalized: bool = False  # a penalty is set: the slot's token counts are kept
    epoch: int = 0
    prefilled: int = 0  # context positions whose KV is in the slot (goal: context_len - 1)
    finished: bool = False
    last_active: float = 0.0
    queue: collections.deque = dataclasses.field(default_factory=collections.deque)
    # The session's acceptance totals so far (every `VerifyResult` carries them).
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)

    @property
    def committed(self) -> int:
        return len(self.tokens)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def context_len(self) -> int:
        """Prompt + tokens committed before a resume: what prefill covers."""
        return self.prompt_len + len(self.config.committed)

    @property
    def ready_to_verify(self) -> bool:
        return self.prefilled >= self.context_len - 1


@dataclasses.dataclass
class Metrics:
    """The scheduler's counts over every step so far, and the last step's shape (what
    `verify.metrics` exports)."""

    steps: int = 0
    prefill_steps: int = 0
    rows_verified: int = 0
    tokens_committed: int = 0
    last_step_s: float = 0.0
    last_rows: int = 0
    last_bucket_rows: int = 0
    last_width: int = 0
    last_attended: int = 0  # KV positions per row the last step read (its KV bucket)
    occupancy_sum: float = 0.0
    kv_read: int = 0  # slot positions read by every step so far (rows x KV bucket)
    kv_live: int = 0  # ... of which live rows' positions (the rest is padding)

    @property
    def mean_occupancy(self) -> float:
        return self.occupancy_sum / self.steps if self.steps else 0.0

    @property
    def kv_padding(self) -> float:
        """The share of the KV positions steps read that were padding (filler rows, the
        bucket past a row's length): 0 is a step that reads only live KV."""
        return 1 - self.kv_live / self.kv_read if self.kv_read else 0.0


def row_arrays(pairs: list[tuple[Session, DraftBlock]], R: int, W: int) -> dict[str, np.ndarray]:
    """A batch's per-row arrays, sampling and q aside (`VerifyBatch`'s tokens, start,
    num_draft, slots, live, sync, keys) for its (session, head block) rows; rows past them
    are filler: zeros, start 1, not live."""
    tokens = np.zeros((R, W), np.int32)
    start = np.ones(R, np.int32)
    num_draft = np.zeros(R, np.int32)
    slots = np.zeros(R, np.int32)
    live = np.zeros(R, bool)
    sync = np.zeros(R, bool)
    keys = np.zeros((R, 2), np.uint32)
    for i, (s, b) in enumerate(pairs):
        n = len(b.tokens)
        tokens[i, 0] = s.tokens[-1]
        tokens[i, 1 : n + 1] = b.tokens
        start[i], num_draft[i], slots[i], live[i] = s.committed, n, s.slot, True
        sync[i] = s.config.mode == "sync"
        keys[i] = s.key
    return dict(
        tokens=tokens, start=start, num_draft=num_draft, slots=slots, live=live, sync=sync,
        keys=keys,
    )  # fmt: skip
