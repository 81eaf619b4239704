"""Continuous-batching scheduler over a KV slot pool (in-process; transport-agnostic).

Sessions submit draft blocks into bounded FIFO queues. Each `tick()`:

1. evicts idle sessions, answers stale heads (old epoch, or start != committed length);
2. runs one chunk of pending prompt prefill (long prompts never stall the others);
3. forms ONE padded batch from the head block of every ready session, in virtual-token-
   counter order (the tenant that has been served the fewest tokens goes first, so a
   tenant flooding blocks cannot starve others), under a token budget;
4. runs the jitted verify step and commits each row (cut at stop tokens/max_new_tokens);
   a session with penalties also adds what it committed, and nothing else, to its slot's
   token counts on device (`verify.counts`: the rollback that goes with the KV length).

Every decision is host-side bookkeeping on small numbers; all model work is two jitted
functions with static shapes from a few (rows, width) buckets.
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.decoding.sampling import SamplingParams, check_seed, session_key
from jaxspec.figures import AcceptanceFigures
from jaxspec.nn.model import Model, init_cache
from jaxspec.protocol import (
    GAMMA_CEILING,
    MODES,
    DraftBlock,
    DraftSpec,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SessionConfig,
    SessionInfo,
    VerifyResult,
)
from verify import counts as slot_counts
from verify.step import (
    VerifyBatch,
    cache_sharding,
    make_prefill,
    make_verify_step,
    shard_params,
)


@dataclasses.dataclass
class Session:
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


# The most stop tokens a session may name (a bound on every list a request carries: the
# prompt and the committed tokens are bounded by max_len already).
MAX_STOP_TOKENS = 64

# How many closed session ids the scheduler remembers (see `Scheduler.closed_recently`).
CLOSED_MEMORY = 4096


class WarmupCancelled(Exception):
    """Raised out of `Scheduler.warmup` when its progress callback asks it to stop."""


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def row_buckets_for(max_sessions: int, data: int = 1) -> tuple[int, ...]:
    """Row buckets data, 2 data, 4 data, ... below `max_sessions`, then `max_sessions`: few
    compiled step shapes, each a multiple of the mesh's `data` shards (when max_sessions is)."""
    rows, b = [], data
    while b < max_sessions:
        rows.append(b)
        b *= 2
    return (*rows, max_sessions)


def _row_arrays(pairs: list[tuple[Session, DraftBlock]], R: int, W: int) -> dict[str, np.ndarray]:
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


# How many batches' sampling arrays the scheduler keeps (`Scheduler._sampling`).
SAMPLING_MEMORY = 64


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


def kv_buckets_for(max_len: int) -> tuple[int, ...]:
    """Half the slot (rounded up to 64 positions) and the whole slot: two attention widths,
    so a batch of short sessions reads half the KV a full-slot step would. Slots under 256
    positions keep one (their KV is small next to the weights; a bucket costs compilations)."""
    half = -(-max_len // 2 // 64) * 64
    return (half, max_len) if 128 <= half < max_len else (max_len,)


def shape_name(shape: tuple[str, int, int, int]) -> str:
    """How logs name a `warmup_shapes` shape: "step RxWxA" (rows, width, KV bucket), "prefill
    RxC" (rows, chunk)."""
    kind, R, W, A = shape
    return f"{kind} {R}x{W}" + (f"x{A}" if kind == "step" else "")


def warmup_order(config: SchedulerConfig) -> list[tuple[str, int, int, int]]:
    """`warmup_shapes` in the order the first requests need them: row bucket by row bucket,
    smallest first, each bucket's prefill (a session's prompt comes first) and then its step
    widths, the full block (max_gamma + 1, what a fixed-gamma client sends) first, at the
    shortest KV bucket first. The first `1 + len(config.width_buckets)` shapes serve a lone
    session completely while it fits the shortest KV bucket."""
    out = []
    for R in config.row_buckets:
        out.append(("prefill", R, config.prefill_chunk, config.max_len))
        out += [
            ("step", R, W, A) for A in config.kv_buckets for W in reversed(config.width_buckets)
        ]
    return out


def warmup_shapes(config: SchedulerConfig) -> list[tuple[str, int, int, int]]:
    """What `Scheduler.warmup` compiles, in order: ("step", rows, width, attended) for every
    row, width and KV bucket (the shortest KV first: new sessions need it), then ("prefill",
    rows, prefill_chunk, max_len) for every row bucket (its progress names them "step
    RxWxA", "prefill RxC")."""
    step = [
        ("step", R, W, A)
        for A in config.kv_buckets
        for R in config.row_buckets
        for W in config.width_buckets
    ]
    return step + [("prefill", R, config.prefill_chunk, config.max_len) for R in config.row_buckets]


class Scheduler:
    """Sessions, queues and the batch former over one target model and one slot pool.

    `config` fixes the pool and the compiled shapes; `mesh` (from `verify.step.make_mesh`)
    shards them over ("data", "model") devices; `clock` is for idle eviction (tests fake it);
    `calls` wraps the jitted functions (multi-host lockstep, `verify.multihost.Lockstep.wrap`).
    """

    def __init__(
        self,
        model: Model,
        config: SchedulerConfig,
        *,
        mesh: Any = None,
        clock: Callable[[], float] = time.monotonic,
        calls: Callable[[str, Callable], Callable] | None = None,
    ):
        self.config = config
        self.model = model
        self.vocab = model.config.vocab_size
        self.clock = clock
        self.mesh = mesh
        if mesh is not None:
            data = mesh.shape["data"]
            if config.max_sessions % data or any(b % data for b in config.row_buckets):
                raise ValueError(f"slots and row buckets must be multiples of data={data}")
        self.params = model.params if mesh is None else shard_params(model.params, mesh)
        cache = init_cache(model.config, config.max_sessions, config.max_len, model.dtype)
        self.cache = cache if mesh is None else jax.device_put(cache, cache_sharding(mesh))
        # `calls(name, fn)` may wrap the two jitted functions ("step", "prefill"): the
        # multi-host leader hands each call to the other processes (verify.multihost).
        wrap = calls or (lambda _name, fn: fn)
        self._step = wrap("step", make_verify_step(model.module, mesh))
        self._prefill = wrap("prefill", make_prefill(model.module, mesh))
        # The penalties' token counts per slot (docs/design.md §5).
        self.counts = slot_counts.init(config.max_sessions, self.vocab)
        self.sessions: dict[str, Session] = {}
        self.free_slots = list(range(config.max_sessions))[::-1]
        self.tenant_tokens: collections.Counter[str] = collections.Counter()
        # Per tenant, for its own Stats: verify steps that carried one of its blocks, and the
        # tokens committed to its sessions (Metrics.steps / tokens_committed are all tenants').
        self.tenant_steps: collections.Counter[str] = collections.Counter()
        self.tenant_committed: collections.Counter[str] = collections.Counter()
        self.metrics = Metrics()
        self._ticket = 0
        self._zeros: dict[Any, jax.Array] = {}  # device constants (`_resident`)
        self._sampling_of: dict[tuple, SamplingParams] = {}  # (settings, R) -> arrays
        # The last CLOSED_MEMORY sessions closed (by close, idle eviction): id -> tenant. The
        # service answers a second close of one of them OK for its own tenant (a normal end).
        self.closed: collections.OrderedDict[str, str] = collections.OrderedDict()
        # The last CLOSED_MEMORY sessions evicted for making no progress: id -> tenant (their
        # next block's NOT_FOUND says so).
        self.evicted: collections.OrderedDict[str, str] = collections.OrderedDict()

    # ---- sessions ------------------------------------------------------------------------

    def open(self, config: SessionConfig, tenant: str = "default") -> SessionInfo:
        """Validate `config`, take a slot, queue the prompt's prefill."""
        self._validate_config(config)
        if not self.free_slots:
            self.evict_idle()
        if not self.free_slots:
            raise ResourceExhausted(f"all {len(self.sessions)} session slots are in use")
        sid = secrets.token_hex(16)  # 128 random bits
        self.sessions[sid] = Session(
            id=sid,
            tenant=tenant,
            config=config,
            slot=self.free_slots.pop(),
            tokens=list(config.prompt) + list(config.committed),
            prompt_len=len(config.prompt),
            stops=self._stops(config),
            key=np.asarray(session_key(config.seed, 0)),
            penalized=config.sampling.penalized,
            last_active=self.clock(),
            figures=AcceptanceFigures(accepted_per_position=(0,) * config.draft.gamma),
        )
        s = self.sessions[sid]
        if s.penalized:  # the slot's counts: the prompt and the committed tokens (a resume)
            self.counts = slot_counts.reset(
                self.counts, jnp.int32(s.slot), slot_counts.padded(config.prompt),
                slot_counts.padded(config.committed),
            )  # fmt: skip
        return SessionInfo(
            session_id=sid,
            gamma=config.draft.gamma,
            max_sparse_k=self.config.max_sparse_k,
            vocab_size=self.vocab,
            max_new_tokens=config.max_new_tokens,
        )

    def _stops(self, c: SessionConfig) -> frozenset[int]:
        """The session's stop tokens: its own, or the target's EOS ids."""
        stops = self.model.config.eos_token_ids if c.stop_tokens is None else c.stop_tokens
        return frozenset(stops)

    def _validate_config(self, c: SessionConfig) -> None:
        if not c.prompt:
            raise InvalidArgument("the prompt is empty")
        if any(not 0 <= t < self.vocab for t in c.prompt):
            raise InvalidArgument(f"prompt token ids must be in [0, {self.vocab})")
        if c.mode not in MODES:
            raise InvalidArgument(f"mode must be one of {MODES}")
        if c.stop_tokens is not None:
            if len(c.stop_tokens) > MAX_STOP_TOKENS:
                raise InvalidArgument(f"at most {MAX_STOP_TOKENS} stop tokens")
            if any(not 0 <= t < self.vocab for t in c.stop_tokens):
                raise InvalidArgument(f"stop token ids must be in [0, {self.vocab})")
        c.draft.check(
            vocab_size=self.vocab,
            max_gamma=self.config.max_gamma,
            max_sparse_k=self.config.max_sparse_k,
        )
        if c.max_new_tokens < 1:
            raise InvalidArgument("max_new_tokens must be >= 1")
        try:
            check_seed(c.seed)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if c.committed:
            if any(not 0 <= t < self.vocab for t in c.committed):
                raise InvalidArgument(f"committed token ids must be in [0, {self.vocab})")
            if len(c.committed) >= c.max_new_tokens or set(c.committed) & self._stops(c):
                raise InvalidArgument("the committed tokens already finish this session")
        need = len(c.prompt) + c.max_new_tokens + self.config.max_gamma + 1
        if need > self.config.max_len:
            raise InvalidArgument(
                f"prompt ({len(c.prompt)}) + max_new_tokens ({c.max_new_tokens}) + gamma "
                f"does not fit the verifier's max length {self.config.max_len}"
            )
        # The sampling values were checked as the settings were made (in-process, or as the
        # config came off the wire); only the bias ids' range needs this model's vocabulary.
        c.sampling.check_vocab(self.vocab)

    def get(self, session_id: str, tenant: str = "default") -> Session:
        """The session, if it exists AND belongs to `tenant` (else exactly like unknown)."""
        s = self.sessions.get(session_id)
        if s is None and self.evicted.get(session_id) == tenant:
            raise NotFound(
                f"the session was evicted: no progress for {self.config.idle_timeout_s:g} s "
                "(no block verified; stale blocks do not count)"
            )
        if s is None or s.tenant != tenant:
            raise NotFound("unknown session")
        return s

    def close(self, session_id: str, tenant: str = "default") -> list[tuple[int, VerifyResult]]:
        """Free the slot; queued blocks are answered stale (returned for the transport)."""
        s = self.get(session_id, tenant)
        return self._drop(s)

    def closed_recently(self, session_id: str, tenant: str = "default") -> bool:
        """Whether `tenant` had this session and it was closed (one of the last
        CLOSED_MEMORY closes): closing it again is a normal end, not an error."""
        return self.closed.get(session_id) == tenant

    def _drop(self, s: Session) -> list[tuple[int, VerifyResult]]:
        del self.sessions[s.id]
        self.free_slots.append(s.slot)
        self.closed[s.id] = s.tenant
        while len(self.closed) > CLOSED_MEMORY:
            self.closed.popitem(last=False)
        out = [(t, self._stale(s, b)) for t, b in s.queue]
        s.queue.clear()
        return out

    def evict_idle(self) -> list[tuple[int, VerifyResult]]:
        """Drop every session that made no progress for `idle_timeout_s`: progress is being
        opened, a prefill chunk, or a verified block. A stale block is no progress, so a
        client cannot hold a slot by sending blocks that do no work; queued blocks do not
        keep a session either (a valid one is verified at the next step). Their queued blocks
        are answered stale."""
        now = self.clock()
        out = []
        for s in list(self.sessions.values()):
            if now - s.last_active > self.config.idle_timeout_s:
                out += self._drop(s)
                self.evicted[s.id] = s.tenant
                while len(self.evicted) > CLOSED_MEMORY:
                    self.evicted.popitem(last=False)
        return out

    # ---- blocks --------------------------------------------------------------------------

    def pending(self) -> int:
        # a copy of the sessions first: `LocalVerifier.verify` counts without the lock
        return sum(len(s.queue) for s in list(self.sessions.values()))

    def check(
        self, block: DraftBlock, tenant: str = "default", *, waiting: int = 0, everyone: int = 0
    ) -> Session:
        """What `submit` refuses, refused without queueing the block: its session, if not.
        `waiting` / `everyone`: blocks accepted but not queued yet (`LocalVerifier`'s
        inbox), this session's / all sessions', counted against the limits."""
        s = self.get(block.session_id, tenant)
        self._validate_block(s, block)
        c = self.config
        if len(s.queue) + waiting >= c.max_queue_per_session:
            raise ResourceExhausted(f"more than {c.max_queue_per_session} blocks in flight")
        if self.pending() + everyone >= c.max_pending:
            raise ResourceExhausted("the verifier is overloaded")
        return s

    def submit(self, block: DraftBlock, tenant: str = "default") -> int:
        """Validate and queue a block; returns its ticket (the result comes from `tick`)."""
        s = self.check(block, tenant)
        self._ticket += 1
        s.queue.append((self._ticket, block))  # no progress yet: `last_active` stays
        return self._ticket

    def _validate_block(self, s: Session, b: DraftBlock) -> None:
        n, gamma = len(b.tokens), s.config.draft.gamma
        if gamma == 0 and n:
            raise InvalidArgument(f"a gamma-0 session's blocks hold no drafts, got {n}")
        # A block may hold no drafts: an adaptive sync session's pause (edge.adaptive), or a
        # session that stopped drafting (a loaded server: edge.session's `drafts_off`).
        if n > gamma:
            raise InvalidArgument(f"a block holds 0..{gamma} drafts, got {n}")
        if b.epoch > s.epoch:
            raise FailedPrecondition(f"unknown epoch {b.epoch} (current {s.epoch})")
        if b.start < s.prompt_len:
            raise InvalidArgument("a block cannot start inside the prompt")
        if n:  # n == 0, speculation off: the verifier samples the block's one token (no q)
            self._check_q_layout(s.config.draft, b)

    def _check_q_layout(self, draft: DraftSpec, b: DraftBlock) -> None:
        """What of a block's q needs its session: the session's encoding and q dtype, q's
        width at this vocabulary (or sparse_k), drafts and sparse ids inside the vocabulary.
        q's values were checked once, as the block was made (`DraftBlock`: in-process, or
        `jaxspec.protocol.wire` off the wire), and are not read again here."""
        n = len(b.tokens)
        if any(t < 0 or t >= self.vocab for t in b.tokens):
            raise InvalidArgument(f"draft token ids must be in [0, {self.vocab})")
        if draft.encoding == "full":
            if b.q is None or b.q_ids is not None or b.q.shape != (n, self.vocab):
                raise InvalidArgument(f"full q must have shape ({n}, {self.vocab})")
        elif draft.encoding == "sparse":
            k = draft.sparse_k
            if b.q is None or b.q_ids is None or b.q.shape != (n, k):
                raise InvalidArgument(f"sparse q and q_ids must have shape ({n}, {k})")
            if np.any((b.q_ids < 0) | (b.q_ids >= self.vocab)):
                raise InvalidArgument(f"sparse q ids must be in [0, {self.vocab})")
        elif b.q is not None:
            raise InvalidArgument("onehot blocks carry no q")
        # A float16 session's q is exactly float16 values times one scale per draft (the
        # block proved it as it was made); a float32 session's carries no scale.
        if draft.f16 and b.q_scale is None:
            raise InvalidArgument(f"a float16 session's blocks carry {n} q_scale values")
        if not draft.f16 and b.q_scale is not None:
            raise InvalidArgument("q_scale is for q_dtype float16 sessions (full or sparse)")

    def _stale(self, s: Session, b: DraftBlock) -> VerifyResult:
        return VerifyResult(
            epoch=b.epoch, start=b.start, new_epoch=s.epoch, stale=True, finished=s.finished,
            figures=s.figures,
        )  # fmt: skip

    # ---- the tick ------------------------------------------------------------------------

    def tick(self) -> list[tuple[int, VerifyResult]]:
        """One scheduling step; returns (ticket, result) for every block answered."""
        out = self.evict_idle()
        self._prefill_tick()
        ready: list[Session] = []
        for s in self.sessions.values():
            while s.queue:
                ticket, b = s.queue[0]
                if s.finished or b.epoch != s.epoch or b.start != s.committed:
                    s.queue.popleft()
                    out.append((ticket, self._stale(s, b)))
                    continue
                if s.ready_to_verify:
                    ready.append(s)
                break
        if ready:
            out += self._verify_tick(self._select(ready))
        return out

    def _select(self, ready: list[Session]) -> list[Session]:
        """Virtual token counter: serve the least-served tenant first, within the budget."""
        active = {s.tenant for s in ready}
        floor = min(self.tenant_tokens[t] for t in active)
        for t in active:  # a tenant that was idle does not bank credit
            self.tenant_tokens[t] = max(self.tenant_tokens[t], floor)
        counters = dict((t, self.tenant_tokens[t]) for t in active)
        by_tenant: dict[str, collections.deque[Session]] = collections.defaultdict(
            collections.deque
        )
        for s in sorted(ready, key=lambda s: s.queue[0][0]):  # oldest block first
            by_tenant[s.tenant].append(s)
        chosen, budget = [], self.config.token_budget
        while by_tenant and len(chosen) < self.config.row_buckets[-1]:
            tenant = min(by_tenant, key=lambda t: (counters[t], t))
            s = by_tenant[tenant][0]
            cost = len(s.queue[0][1].tokens) + 1
            if cost > budget:
                break
            by_tenant[tenant].popleft()
            if not by_tenant[tenant]:
                del by_tenant[tenant]
            chosen.append(s)
            budget -= cost
            counters[tenant] += cost
        return chosen

    def _verify_tick(self, rows: list[Session]) -> list[tuple[int, VerifyResult]]:
        blocks = [s.queue.popleft() for s in rows]
        R = _bucket(len(rows), self.config.row_buckets)
        W = _bucket(max(len(b.tokens) for _, b in blocks) + 1, self.config.width_buckets)
        live = [s.committed + len(b.tokens) for s, (_, b) in zip(rows, blocks, strict=True)]
        A = _bucket(max(live), self.config.kv_buckets)  # positions up to committed - 1 + n
        batch = self._build_batch(rows, [b for _, b in blocks], R, W, A)
        jax.block_until_ready(self.cache)  # a prefill still in flight is not this step's time
        t0 = time.perf_counter()
        self.cache, res = self._step(self.params, self.cache, batch)
        res = jax.tree.map(np.asarray, res)
        m = self.metrics
        m.last_step_s = time.perf_counter() - t0
        m.steps += 1
        m.last_rows, m.last_bucket_rows, m.last_width, m.last_attended = len(rows), R, W, A
        m.occupancy_sum += len(rows) / R
        m.kv_read += R * A
        m.kv_live += sum(live)
        m.rows_verified += len(rows)
        self.tenant_steps.update({s.tenant for s in rows})
        out = []
        counted = np.full((R, W), -1, np.int32)  # what each penalized row adds to its counts
        for i, (s, (ticket, b)) in enumerate(zip(rows, blocks, strict=True)):
            r = self._commit(s, b, res, i)
            out.append((ticket, r))
            if s.penalized:
                counted[i, : len(r.tokens)] = r.tokens
        if (counted >= 0).any():
            self.counts = slot_counts.commit(
                self.counts, jnp.asarray(batch.slots), jnp.asarray(counted)
            )
        return out

    def _commit(self, s: Session, b: DraftBlock, res: dict, i: int) -> VerifyResult:
        n = len(b.tokens)
        emitted = [int(t) for t in res["tokens"][i, : res["num_emitted"][i]]]
        accepted = int(res["num_accepted"][i])
        room = s.config.max_new_tokens - s.new_tokens
        cut = emitted[:room]
        for j, t in enumerate(cut):
            if t in s.stops:
                cut = cut[: j + 1]
                break
        s.tokens += cut
        finished = s.new_tokens >= s.config.max_new_tokens or (bool(cut) and cut[-1] in s.stops)
        s.finished = finished
        rejected = accepted < n
        if rejected:
            s.epoch += 1
        kept = min(accepted, len(cut))  # accepted drafts that were committed
        s.figures += AcceptanceFigures.of_round(n, kept, len(cut))
        s.last_active = self.clock()
        self.tenant_tokens[s.tenant] += n + 1
        self.metrics.tokens_committed += len(cut)
        self.tenant_committed[s.tenant] += len(cut)
        extra = len(emitted) > accepted
        return VerifyResult(
            epoch=b.epoch,
            start=b.start,
            accepted=kept,
            tokens=tuple(cut),
            next_token=emitted[accepted] if extra and len(cut) > accepted else None,
            new_epoch=s.epoch,
            finished=finished,
            figures=s.figures,
            step_s=self.metrics.last_step_s,
        )

    def _build_batch(
        self, rows: list[Session], blocks: list[DraftBlock], R: int, W: int, A: int
    ) -> VerifyBatch:
        """The step's padded batch: row i is `rows[i]` with its head block `blocks[i]`, then
        filler rows (not live) up to R; W columns (the last committed token, then the
        drafts); attending over the first A positions of each slot."""
        pairs = list(zip(rows, blocks, strict=True))
        arrays = _row_arrays(pairs, R, W)
        # Filler rows point at a free slot (or any slot: they write nothing, live=False).
        used = {s.slot for s in rows}
        arrays["slots"][len(rows) :] = next((x for x in self.free_slots if x not in used), 0)
        # Host arrays: the jitted step copies them in with its call (one call per step rather
        # than a device transfer dispatched per array).
        return VerifyBatch(
            **arrays,
            sampling=self._sampling([s.config.sampling for s in rows], R),
            **self._draft_q(pairs, R, W - 1),
            attend=self._resident(A, lambda: jnp.arange(A, dtype=jnp.int32)),
            counts=slot_counts.gather(self.counts, arrays["slots"]),
        )

    def _sampling(self, settings: list[Any], R: int) -> SamplingParams:
        """The `[R]` sampling arrays of a batch's rows' `SamplingSettings` (filler rows past
        them have every setting off: greedy, no filter, bias or penalty), made once per
        (settings, R) while the same sessions keep meeting: the last SAMPLING_MEMORY kept."""
        key = (tuple(settings), R)
        got = self._sampling_of.get(key)
        if got is None:
            if len(self._sampling_of) >= SAMPLING_MEMORY:
                self._sampling_of.clear()
            got = self._sampling_of[key] = SamplingParams.of(settings, rows=R)
        return got

    def _draft_q(
        self, pairs: list[tuple[Session, DraftBlock]], R: int, K: int
    ) -> dict[str, jax.Array]:
        """The batch's draft distributions (`VerifyBatch`'s is_full, q_full, q_ids, q_probs)
        for K draft positions: a full row's q in q_full, a sparse row's ids and
        probabilities, a one-hot row's tokens; every other position a valid (unused) one-hot
        on token 0. q_full, [R, K, V] float32 (0.8 MB a row at SmolLM2's vocabulary), is
        built and copied to the device only when a row is full; otherwise one resident zero
        buffer per shape."""
        k = self.config.max_sparse_k
        full_rows = any(s.config.draft.encoding == "full" and b.tokens for s, b in pairs)
        is_full = np.zeros(R, bool)
        q_full = np.zeros((R, K, self.vocab), np.float32) if full_rows else None
        q_ids = np.zeros((R, K, k), np.int32)
        q_probs = np.zeros((R, K, k), np.float32)
        q_probs[:, :, 0] = 1.0  # filler positions: a valid (unused) one-hot on token 0
        for i, (s, b) in enumerate(pairs):
            n, draft = len(b.tokens), s.config.draft
            if n == 0:
                pass  # no drafts: the step samples the token (verify.step)
            elif draft.encoding == "full":
                is_full[i] = True
                q_full[i, :n] = b.q
            elif draft.encoding == "sparse":
                q_ids[i, :n, : draft.sparse_k] = b.q_ids
                q_probs[i, :n, : draft.sparse_k] = b.q
                q_probs[i, :n, draft.sparse_k :] = 0.0  # unused id columns weigh nothing
            else:
                q_ids[i, :n, 0] = b.tokens
        return dict(
            is_full=is_full,
            q_full=q_full
            if q_full is not None
            else self._resident((R, K), lambda: jnp.zeros((R, K, self.vocab), jnp.float32)),
            q_ids=q_ids,
            q_probs=q_probs,
        )

    def _resident(self, key: Any, make: Callable[[], jax.Array]) -> jax.Array:
        """A device constant made once per key and reused by every step: `VerifyBatch.attend`
        (`arange(A)`, key A) and the zero `[R, K, V]` q_full of batches without a full row
        (key (R, K))."""
        if key not in self._zeros:
            self._zeros[key] = make()
        return self._zeros[key]

    def _prefill_tick(self) -> None:
        todo = [s for s in self.sessions.values() if not s.ready_to_verify]
        if not todo:
            return
        rows = self.config.row_buckets
        todo = todo[: rows[-1]]
        R, C = _bucket(len(todo), rows), self.config.prefill_chunk
        tokens = np.zeros((R, C), np.int32)
        positions = np.zeros((R, C), np.int32)
        valid = np.zeros((R, C), bool)
        slots = np.full(R, todo[0].slot, np.int32)
        for i, s in enumerate(todo):
            lo = s.prefilled
            hi = min(s.context_len - 1, lo + C)
            tokens[i, : hi - lo] = s.tokens[lo:hi]
            positions[i] = lo + np.arange(C)
            valid[i, : hi - lo] = True
            slots[i] = s.slot
            s.prefilled = hi
            s.last_active = self.clock()  # a prefill chunk is progress
        self.cache = self._prefill(
            self.params, self.cache, jnp.asarray(tokens), jnp.asarray(positions),
            jnp.asarray(valid), jnp.asarray(slots),
        )  # fmt: skip
        self.metrics.prefill_steps += 1

    def warmup(
        self,
        progress: Callable[[int, int, str], None] | None = None,
        shapes: list[tuple[str, int, int, int]] | None = None,
    ) -> None:
        """Compile every (rows, width) bucket of the step and every prefill bucket now (or
        `shapes`, a part of `warmup_shapes`, e.g. `warmup_order`'s first ones), so no request
        waits for their compilation (filler rows change nothing, live sessions included).

        `progress(done, total, shape)` is called after each shape is compiled and run, e.g.
        to log it; it may raise (e.g. `WarmupCancelled`) to stop the warm-up there."""
        shapes = warmup_shapes(self.config) if shapes is None else shapes
        for done, (kind, R, W, A) in enumerate(shapes, 1):
            if kind == "step":
                batch = self._build_batch([], [], R, W, A)
                self.cache, _ = self._step(self.params, self.cache, batch)
            else:
                z = jnp.zeros((R, W), jnp.int32)
                self.cache = self._prefill(
                    self.params, self.cache, z, z, jnp.zeros((R, W), bool),
                    jnp.zeros(R, jnp.int32),
                )  # fmt: skip
            jax.block_until_ready(self.cache)
            if progress is not None:
                progress(done, len(shapes), shape_name((kind, R, W, A)))

    def precompile_args(self, shape: tuple[str, int, int, int]) -> tuple[Callable, tuple]:
        """The jitted function and abstract arguments of one `warmup_shapes` shape, read from
        the scheduler's state (take them under the owner's lock); `precompile` then compiles
        them without it."""
        kind, R, W, A = shape
        # As the live arrays are: a sharding only where committed (a mesh's), else jit keys
        # a real call apart from this lowering and compiles the shape again at first use.
        cache = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=a.sharding if a.committed else None
            ),
            self.cache,
        )
        if kind == "step":
            return self._step, (self.params, cache, self._build_batch([], [], R, W, A))
        z = jnp.zeros((R, W), jnp.int32)
        return self._prefill, (self.params, cache, z, z, jnp.zeros((R, W), bool),
                               jnp.zeros(R, jnp.int32))  # fmt: skip

    def step_hlo(self, rows: int, width: int, attended: int) -> str:
        """The compiled verify step's HLO text at one batch shape (`rows` rows, `width`
        columns, attending over `attended` positions): the ops a profile of the step
        attributes its time to (jaxspec_apps.bench.stepprofile). Plain jitted step only."""
        batch = self._build_batch([], [], rows, width, attended)
        return self._step.lower(self.params, self.cache, batch).compile().as_text()

    @staticmethod
    def precompile(fn: Callable, args: tuple) -> None:
        """Compile `fn` for `args` ahead of time, running nothing and touching no state (so a
        serving scheduler may step meanwhile): its first real call of that shape finds the
        executable compiled. Needs the plain jitted functions (not multi-host `calls`)."""
        fn.lower(*args).compile()
