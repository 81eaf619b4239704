"""The scheduler's static settings (`SchedulerConfig`): its slot pool, the drafts a block may
carry, its compiled shape buckets (`jaxspec.compilation.shapes`), its queues and idle
timeout, validated once as they are made."""

from __future__ import annotations

import dataclasses

from jaxspec.compilation.shapes import kv_buckets_for, row_buckets_for
from jaxspec.protocol import GAMMA_CEILING


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's static settings, validated once here (`ValueError`).

    `row_buckets` (batch rows per compiled step), `width_buckets` (block width = drafts + 1)
    and `token_budget` (positions verified per step) are derived when left None: powers of two
    up to `max_sessions`; 1, then (3, 5) below max_gamma + 1 and max_gamma + 1; the largest row
    bucket times (max_gamma + 1). Width 1 holds only blocks without drafts (gamma 0, or an
    adaptive session that stopped drafting): a batch of them runs as a plain decode step.
    They are filled in at construction, so a `dataclasses.replace` that
    changes `max_gamma` or `max_sessions` must give them again (or fails validation).
    """

    max_sessions: int = 64  # KV slots: live sessions at once
    max_len: int = 512  # positions per slot (prompt + new tokens + max_gamma + 1)
    max_gamma: int = 8  # the most drafts a block may carry here (<= protocol GAMMA_CEILING)
    max_sparse_k: int = 16  # the most q columns a sparse block may carry
    row_buckets: tuple[int, ...] | None = None
    width_buckets: tuple[int, ...] | None = None
    # Slot positions a step attends over (bucketed by the batch's longest live row): the
    # attention reads only those, not the whole slot. Derived: half the slot, the slot.
    kv_buckets: tuple[int, ...] | None = None
    token_budget: int | None = None
    prefill_chunk: int = 64  # prompt positions prefilled per row per tick
    max_queue_per_session: int = 8  # blocks in flight per session
    max_pending: int = 4096  # blocks queued over all sessions
    idle_timeout_s: float = 300.0  # a session without progress this long is evicted

    def __post_init__(self) -> None:
        positive = ("max_sessions", "max_len", "max_sparse_k", "prefill_chunk",
                    "max_queue_per_session", "max_pending")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.max_gamma <= GAMMA_CEILING:
            raise ValueError(f"max_gamma must be in [1, {GAMMA_CEILING}], got {self.max_gamma}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        width = self.max_gamma + 1
        rows = self.row_buckets or row_buckets_for(self.max_sessions)
        widths = self.width_buckets or (1, *(w for w in (3, 5) if w < width), width)
        object.__setattr__(self, "row_buckets", tuple(sorted(set(rows))))
        object.__setattr__(self, "width_buckets", tuple(sorted(set(widths))))
        kv = self.kv_buckets or kv_buckets_for(self.max_len)
        object.__setattr__(self, "kv_buckets", tuple(sorted(set(kv))))
        if self.kv_buckets[0] < 1 or self.kv_buckets[-1] != self.max_len:
            raise ValueError(
                f"kv buckets must be in [1, max_len] and end at max_len={self.max_len}, "
                f"got {self.kv_buckets}"
            )
        if self.token_budget is None:
            object.__setattr__(self, "token_budget", self.row_buckets[-1] * width)
        if self.row_buckets[0] < 1 or self.row_buckets[-1] > self.max_sessions:
            raise ValueError(f"row buckets must be in [1, max_sessions={self.max_sessions}]")
        if self.width_buckets[0] < 1 or self.width_buckets[-1] != width:
            raise ValueError(
                f"width buckets must be in [1, max_gamma + 1] and end at {width}, "
                f"got {self.width_buckets}"
            )
        if self.token_budget < width:
            raise ValueError(f"token_budget must hold one full block ({width} positions)")
