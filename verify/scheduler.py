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
import secrets
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.compilation.shapes import bucket_in, shape_name, warmup_shapes
from jaxspec.decoding.sampling import SamplingParams, check_seed, session_key
from jaxspec.figures import AcceptanceFigures
from jaxspec.nn.model import Model, init_cache
from jaxspec.protocol import (
    MODES,
    DraftBlock,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SessionConfig,
    SessionInfo,
    VerifyResult,
)
from verify import counts as slot_counts
from verify.admission import MAX_STOP_TOKENS, check_block
from verify.scheduler_config import SchedulerConfig
from verify.sessions import Metrics, Session, row_arrays
from verify.step import (
    VerifyBatch,
    cache_sharding,
    make_prefill,
    make_verify_step,
    shard_params,
)

# How many closed session ids the scheduler remembers (see `Scheduler.closed_recently`).
CLOSED_MEMORY = 4096


class WarmupCancelled(Exception):
    """Raised out of `Scheduler.warmup` when its progress callback asks it to stop."""


# How many batches' sampling arrays the scheduler keeps (`Scheduler._sampling`).
SAMPLING_MEMORY = 64


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
        check_block(block, s, self.vocab)
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
        R = bucket_in(len(rows), self.config.row_buckets)
        W = bucket_in(max(len(b.tokens) for _, b in blocks) + 1, self.config.width_buckets)
        live = [s.committed + len(b.tokens) for s, (_, b) in zip(rows, blocks, strict=True)]
        A = bucket_in(max(live), self.config.kv_buckets)  # positions up to committed - 1 + n
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
        arrays = row_arrays(pairs, R, W)
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
        R, C = bucket_in(len(todo), rows), self.config.prefill_chunk
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
