"""The edge session state machine: drafting ahead, blocks in flight, rollback (docs/design.md §3).

    committed  t0 .. t(c-1)                    what the verifier has confirmed
    in flight  [d_c .. d_{c+g-1}] [..] ..      up to `depth` blocks, drafted optimistically
    result     accepted a, next token x        commit; if x is a correction: new epoch, roll
                                               the drafter back to c + a, append x, redraft
    stale      (old epoch / wrong start)       discard; redraft from the committed prefix

Sync mode is depth 1 with a bonus token after a fully accepted block; pipelined mode keeps
`depth` blocks in flight and gets no bonus. Every draw is keyed by its absolute position,
so the committed tokens are a function of (seed, prompt, models, params, gamma, mode) only:
not of depth, delays or how the transport interleaves messages. Pipelined, not of gamma
either (no bonus: the token at each position is the draft or correction drawn for it), so an
adaptive session's block lengths (`block_len`) change its speed, never its output.

`EdgeSession` holds one session's state (committed tokens, epoch, blocks in flight, the
drafter's state, the trace) and runs it in small steps; `run_session` is the entry point that
makes one and runs it. The session runs against any `VerifierEndpoint` (in-process, gRPC, or
`edge.delayed.DelayedEndpoint`, which simulates a WAN).
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from edge.draft_pool import DraftPool, block_of, wire_rows
from edge.drafter import DraftBatch, Drafter, DrafterState
from jaxspec.compilation.shapes import bucket
from jaxspec.decoding.sampling import SamplingParams, session_key
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import (
    DraftBlock,
    SessionConfig,
    Unavailable,
    VerifierEndpoint,
    VerifyResult,
)


@dataclasses.dataclass
class SessionTrace:
    """What a session did: tokens, timings and counters (for metrics, the demo, benchmarks).
    Acceptance is counted once, by the verifier: `figures`."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    token_times: list[float] = dataclasses.field(default_factory=list)  # commit wall times
    blocks_sent: int = 0
    stale: int = 0
    rollbacks: int = 0
    resumes: int = 0  # sessions reopened after the verifier went away
    start_time: float = 0.0
    end_time: float = 0.0
    events: list[tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    # The verifier's acceptance totals for this session (summed over the sessions a resume
    # opened): what the last answered block carried.
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)
    # Where the session's time went (seconds; `stalls()` adds the rest as host time).
    draft_s: float = 0.0  # drafting blocks, each through its transfer to the host
    draft_wasted_s: float = 0.0  # ... of which drafts never committed: rejected, or stale
    wait_step_s: float = 0.0  # waiting for an answer, up to the verifier's step time
    wait_wire_s: float = 0.0  # ... the rest of that wait: round trip, queue, hops
    wait_stale_s: float = 0.0  # waiting for blocks a rejection had made stale

    def stalls(self) -> dict[str, float]:
        """The session's wall time split: drafting (kept, thrown away), waiting (for the
        verifier's step, for the wire and hops, for stale answers), host (the rest: the
        session's Python, opening and closing), each in seconds."""
        parts = {
            "draft_kept": self.draft_s - self.draft_wasted_s,
            "draft_wasted": self.draft_wasted_s,
            "wait_step": self.wait_step_s,
            "wait_wire": self.wait_wire_s,
            "wait_stale": self.wait_stale_s,
        }
        return parts | {"host": self.end_time - self.start_time - sum(parts.values())}

    @property
    def tokens_per_s(self) -> float:
        dt = self.end_time - self.start_time
        return len(self.tokens) / dt if dt > 0 else 0.0

    @property
    def inter_token_latency_s(self) -> float:
        t = self.token_times
        return (t[-1] - self.start_time) / len(t) if t else 0.0


def _to_wire(batch: DraftBatch, session_id: str, epoch: int) -> DraftBlock:
    """Row 0 of the drafter's batch as the protocol's one block (q in its encoding's layout:
    `full` `[gamma, V]`, `sparse` ids + probabilities `[gamma, k]`, `onehot` none; a float16
    `q_dtype` adds the scale of each draft, `[gamma]`): one device-to-host transfer for all of
    it, q kept float32 (the values sampled from, which the wire sends as they are)."""
    return block_of(jax.device_get(wire_rows(batch)), 0, session_id, epoch)


def _checked_depth(
    drafter: Drafter | None,
    config: SessionConfig,
    depth: int,
    block_len: Callable[[], int] | None,
) -> int:
    """The session's pipeline depth (1 in sync mode and with gamma 0), after checking that
    the drafter drafts as the session's spec says and that `block_len` has an adaptive spec."""
    if config.draft.speculative and (drafter is None or drafter.spec != config.draft):
        have = None if drafter is None else drafter.spec
        raise ValueError(f"the drafter's {have} must match the session's draft {config.draft}")
    if block_len is not None and not config.draft.adaptive:
        raise ValueError("block_len needs an adaptive draft spec (gamma='auto')")
    if config.mode == "sync":
        depth = 1
    if depth < 1:
        raise ValueError("depth must be >= 1")
    return depth


class EdgeSession:
    """One edge session (the state machine of the module docstring), run once by `run()`.

    The arguments are `run_session`'s, which says what each does. The state is named here:
    `committed` (the prompt and every token the verifier confirmed), `epoch`, `inflight`
    (blocks sent, oldest first, with the tasks awaiting their answers), `state` (the
    drafter's, None with gamma 0), `behind` (an empty block went out while the drafter's KV
    lags its context) and `trace` (what the caller gets back). `run()` opens the session,
    then each `_step()` fills the pipeline and takes the oldest answer: a resume, a stale
    block or a verified one (commit, and roll back on a correction).
    """

    def __init__(
        self,
        endpoint: VerifierEndpoint,
        drafter: Drafter | None,
        config: SessionConfig,
        *,
        depth: int = 1,
        on_event: Callable[[str, tuple[int, ...]], None] | None = None,
        on_rollback: Callable[[Any, list[int]], None] | None = None,
        resume_timeout_s: float = 0.0,
        resume_backoff_s: float = 0.2,
        on_retry: Callable[[Unavailable, float], None] | None = None,
        block_len: Callable[[], int] | None = None,
        pool: DraftPool | None = None,
        drafts_off: Callable[[], bool] | None = None,
        first_plain: bool = False,
    ) -> None:
        if pool is not None:
            if drafter is not None and drafter is not pool.drafter:
                raise ValueError("a pooled session drafts with its pool's drafter")
            if on_rollback is not None:
                raise ValueError("on_rollback reads a session's own drafter state: no pool")
            drafter = pool.drafter
        self.pool, self.row = pool, -1  # the pool's row this session drafts in (open)
        self.depth = _checked_depth(drafter, config, depth, block_len)
        self.endpoint, self.drafter, self.config = endpoint, drafter, config
        self.on_event, self.on_rollback, self.on_retry = on_event, on_rollback, on_retry
        self.resume_timeout_s, self.resume_backoff_s = resume_timeout_s, resume_backoff_s
        self.block_len = block_len
        self.drafts_off = drafts_off  # asked before each block: True ends drafting for good
        self.first_plain = first_plain and config.draft.speculative
        # A `block_len` that measures (`edge.adaptive.AdaptiveGamma`) hears each block's draft
        # time and, when it is answered, how many drafts were accepted and how long it took.
        self.observe_draft = getattr(block_len, "observe_draft", None)
        self.observe_result = getattr(block_len, "observe_result", None)
        self.speculative = config.draft.speculative
        self.gamma = config.draft.gamma  # the longest block
        self.prompt = list(config.prompt)
        self.trace = SessionTrace()
        # Set when the session opens (`_start`), after the verifier has accepted the config.
        self.sid = ""
        self.max_len = 0
        self.state: DrafterState | None = None
        # The drafter's context as the host tracks it (no device reads): the next round
        # keeps its first `keep` tokens, appends `tail` (the verifier's tokens since), drafts.
        self.keep = 0
        self.tail: list[int] = []
        self.rolled = False  # a rollback awaits the next round (`on_rollback` sees it then)
        self.sampling: SamplingParams | None = None
        self.keys: jax.Array | None = None
        self.row_key: np.ndarray | None = None
        self.committed = list(self.prompt)
        self.epoch = 0
        self.before_resume = AcceptanceFigures()  # the figures of the sessions a resume closed
        self.inflight: list[tuple[DraftBlock, asyncio.Task[VerifyResult]]] = []
        self.sent_at: dict[int, float] = {}  # id(block) -> when it went out
        self.draft_took: dict[int, float] = {}  # id(block) -> seconds its drafting took
        self.behind = False  # an empty block was sent: the draft's KV lags its context
        self.finished = False
        self._ran = False

    async def run(self) -> SessionTrace:
        """Generate until the verifier says finished; the session is closed however it ends
        once it has opened (a session runs once)."""
        if self._ran:
            raise RuntimeError("an EdgeSession runs once")
        self._ran = True
        self.trace.start_time = time.perf_counter()
        await self._start()
        try:
            while not self.finished:
                await self._step()
        finally:
            for _, task in self.inflight:
                task.cancel()
            await self.endpoint.close_session(self.sid)
            if self.row >= 0:
                self.pool.release(self.row)
            self.trace.end_time = time.perf_counter()
        return self.trace

    async def _start(self) -> None:
        """Open the session, then size and prefill the drafter and make its sampling."""
        self.sid = await self._open(self.config)
        c = self.config
        need = len(self.prompt) + c.max_new_tokens + (self.depth + 1) * self.gamma + 2
        self.max_len = bucket(need, 64)  # sessions share compilations
        # `first_plain`: the drafter's prefill waits for the verifier's first token (behind)
        if self.speculative and self.pool is not None:
            row = self.pool.open(self.max_len)
            try:
                if not self.first_plain:
                    self.pool.prefill(row, self.prompt, len(self.prompt))
            except BaseException:
                self.pool.release(row)
                raise
            self.row, self.keep = row, len(self.prompt)
        elif self.speculative:
            self.state = self.drafter.init(1, self.max_len)
            if not self.first_plain:
                self.state = self.drafter.prefill(self.state, [self.prompt])
            self.keep = len(self.prompt)
        self.behind = self.first_plain
        self.sampling = SamplingParams.of([c.sampling])
        self.keys = session_key(c.seed, 0)[None]
        # read once, before any drafting is queued: a later read waits behind that work
        self.row_key = np.asarray(self.keys[0])  # [2] uint32, the pool's copy

    async def _open(self, cfg: SessionConfig) -> str:
        """Open a session, retrying an unavailable verifier for `resume_timeout_s`."""
        give_up = time.monotonic() + self.resume_timeout_s
        told = False
        while True:
            try:
                return (await self.endpoint.open_session(cfg)).session_id
            except Unavailable as e:
                if time.monotonic() + self.resume_backoff_s > give_up:
                    if not told:
                        raise
                    raise Unavailable(f"{e} (gave up after {self.resume_timeout_s:g} s)") from None
                if not told and self.on_retry is not None:
                    self.on_retry(e, self.resume_timeout_s)
                told = True
                await asyncio.sleep(self.resume_backoff_s)

    def _emit(self, kind: str, toks: Any) -> None:
        """Record an event in the trace and tell `on_event`."""
        self.trace.events.append((kind, tuple(int(t) for t in toks)))
        if self.on_event is not None:
            self.on_event(kind, tuple(int(t) for t in toks))

    def _roll_back(self, length: int, token: int | None = None) -> None:
        """Cut the drafter's context to `length` tokens (then append `token`): noted on the
        host, done by the next round's one call (`_send_drafts`)."""
        if not self.speculative:
            return
        self._cut(length)
        if token is not None:
            self.tail.append(token)
        self.rolled = True

    def _cut(self, length: int) -> None:
        """Note that the drafter's context is cut to `length` tokens (never lengthened)."""
        if length <= self.keep:
            self.keep, self.tail = length, []
        else:
            del self.tail[length - self.keep :]

    # --- sending ----------------------------------------------------------------------------

    async def _fill(self) -> None:
        """Keep `depth` blocks in flight, drafting along the optimistic path."""
        if self.speculative and self.drafts_off is not None and self.drafts_off():
            self._stop_drafting()
        if not self.speculative:  # gamma 0: each block gets exactly one token, so the next
            if any(b.tokens for b, _ in self.inflight):  # ones sit at the next positions,
                return  # once no drafts are in flight (how many they commit is not known)
            while len(self.inflight) < self.depth:
                self._send(self._empty_block(ahead=len(self.inflight)))
            return
        if self.first_plain and len(self.committed) == len(self.prompt):
            if not self.inflight:  # the first token is the verifier's, drafting waits for it
                self._send_empty()
            return
        while len(self.inflight) < self.depth and self._room() and self._wanted():
            n = self._next_len()
            if n == 0:  # no drafting: the verifier samples the token (edge.adaptive)
                self._send_empty()
            else:
                await self._send_drafts(n)

    def _send_empty(self) -> None:
        """Send an empty block at the committed length (the verifier samples its token): a
        speculative session's pause, after which the draft's KV lags its context (`behind`)."""
        block = self._empty_block()
        self.sent_at[id(block)] = time.perf_counter()
        self._send(block)
        self.behind = True

    def _stop_drafting(self) -> None:
        """Decode plainly from here on (`drafts_off`): the drafter's state (or pool row) goes;
        blocks of drafts still in flight are answered as usual, empty blocks follow them."""
        self.speculative, self.state = False, None
        if self.row >= 0:
            self.pool.release(self.row)
            self.row = -1
        self._emit("plain", ())

    def _room(self) -> bool:
        """Whether the drafter's context has room for one more longest block."""
        return self.keep + len(self.tail) + self.gamma <= self.max_len

    def _wanted(self) -> bool:
        """Whether one more block can still be of use: the drafts in flight do not yet reach
        the last token the session may commit (a pipeline `depth` deep drafted up to `depth`
        blocks past it, for nothing: 20 tokens of a 64-token session at depth 5), or none is
        in flight."""
        end = len(self.prompt) + self.config.max_new_tokens
        return self.keep + len(self.tail) < end or not self.inflight

    def _next_len(self) -> int:
        """The next block's length: `gamma`, or what `block_len()` picks (checked)."""
        n = self.gamma if self.block_len is None else operator.index(self.block_len())
        low = 0 if self.config.mode == "sync" else 1  # 0: stop drafting (sync only)
        if not low <= n <= self.gamma:
            raise ValueError(f"block_len() must be in [{low}, {self.gamma}], got {n}")
        return n

    def _empty_block(self, ahead: int = 0) -> DraftBlock:
        """A block with no drafts at the committed length (`ahead` positions past it: a
        gamma-0 session's blocks in flight): the verifier samples its token."""
        start = len(self.committed) + ahead
        return DraftBlock(session_id=self.sid, epoch=self.epoch, start=start, tokens=())

    async def _send_drafts(self, n: int) -> None:
        """Draft a block of `n` tokens, send it and report it ("draft"). The wait for the
        drafts runs on a worker thread, so the event loop (other sessions, a client's
        disconnect, answers arriving) is never held by the device."""
        if self.behind:  # tokens came while nothing drafted: rebuild the draft's KV
            if self.pool is not None:
                self.pool.prefill(self.row, self.committed, len(self.prompt))
            else:
                self.state = self.drafter.prefill(
                    self.state, [self.committed], prompt_len=[len(self.prompt)]
                )
            self.keep, self.tail, self.behind = len(self.committed), [], False
        t_draft = time.perf_counter()
        if self.pool is not None:  # batched with the other sessions' rounds
            block = await self.pool.round(
                self.row, self.keep, self.tail, n, self.config.sampling, self.row_key,
                self.sid, self.epoch,
            )  # fmt: skip
            self.keep, self.tail, self.rolled = self.keep + len(self.tail) + n, [], False
        else:
            batch = self._round(n)
            # waits for the drafts: timed whole
            block = await asyncio.to_thread(_to_wire, batch, self.sid, self.epoch)
        self.sent_at[id(block)] = time.perf_counter()
        took = self.draft_took[id(block)] = self.sent_at[id(block)] - t_draft
        self.trace.draft_s += took
        if self.observe_draft is not None:
            self.observe_draft(n, took)
        self._send(block)
        self._emit("draft", block.tokens)

    def _round(self, n: int) -> DraftBatch:
        """The drafter's round, one donated call: the noted rollback and tokens, then a block
        of `n` drafts; the host tracks the context's length (no device value is read)."""
        tail = [self.tail or [0]]  # [1, K] tokens, the first len(self.tail) appended
        self.state, batch = self.drafter.round(
            self.state, [self.keep], tail, [len(self.tail)], self.sampling, self.keys, gamma=n
        )
        self.keep, self.tail = self.keep + len(self.tail) + n, []
        if self.rolled and self.on_rollback is not None:
            self.on_rollback(self.state, self.committed)
        self.rolled = False
        return batch

    def _send(self, block: DraftBlock) -> None:
        """Put `block` in flight: its answer is awaited in the order sent."""
        self.inflight.append((block, asyncio.ensure_future(self.endpoint.verify(block))))
        self.trace.blocks_sent += 1

    # --- answers ----------------------------------------------------------------------------

    async def _step(self) -> None:
        """Fill the pipeline, then take the oldest block's answer."""
        await self._fill()
        block, task = self.inflight.pop(0)
        sent = self.sent_at.pop(id(block), None)
        took = self.draft_took.pop(id(block), 0.0)
        t0 = time.perf_counter()
        try:
            r = await task
        except Unavailable:
            if self.resume_timeout_s <= 0:
                raise
            await self._resume()
            return
        self._timed(block, r, took, time.perf_counter() - t0)
        self.trace.figures = self.before_resume + r.figures
        if r.stale:
            self._on_stale(block, r)
        else:
            self._on_verified(block, sent, r)

    def _timed(self, block: DraftBlock, r: VerifyResult, took: float, waited: float) -> None:
        """Count one answer's wait and its block's thrown-away drafting in the trace."""
        t = self.trace
        if r.stale:
            t.wait_stale_s += waited
            t.draft_wasted_s += took
            return
        step = min(waited, r.step_s)
        t.wait_step_s += step
        t.wait_wire_s += waited - step
        n = len(block.tokens)
        if n:
            t.draft_wasted_s += took * (n - min(r.accepted, n)) / n

    async def _resume(self) -> None:
        """The verifier went away: drop what was in flight, reopen with the committed tokens
        (epoch 0 again) and redraft from the committed prefix."""
        for _, t in self.inflight:
            t.cancel()
        self.inflight.clear()
        self.sent_at.clear()
        self.draft_took.clear()
        await self.endpoint.close_session(self.sid)
        self.before_resume = self.trace.figures
        done = tuple(self.committed[len(self.prompt) :])
        self.sid = await self._open(dataclasses.replace(self.config, committed=done))
        self.epoch = 0
        if self.speculative:
            self._cut(len(self.committed))
        self.trace.resumes += 1
        self._emit("resume", ())

    def _on_stale(self, block: DraftBlock, r: VerifyResult) -> None:
        """The verifier dropped `block` (an old epoch or a wrong start)."""
        self.trace.stale += 1
        self._emit("stale", block.tokens)
        if r.epoch == self.epoch and block.start == len(self.committed):
            raise RuntimeError("the verifier dropped a current block as stale")
        if not self.inflight or r.epoch == self.epoch:
            # Nothing valid is in flight: redraft from the committed prefix.
            self._roll_back(len(self.committed))
        self.finished = r.finished

    def _on_verified(self, block: DraftBlock, sent: float | None, r: VerifyResult) -> None:
        """Commit the answer to `block` (sent at `sent`); on a correction or bonus token, roll
        the drafter back to it and move to the answer's epoch."""
        trace = self.trace
        now = time.perf_counter()
        if self.observe_result is not None and sent is not None:
            self.observe_result(len(block.tokens), r.accepted, now - sent, r.step_s)
        self.committed += r.tokens
        trace.tokens += r.tokens
        trace.token_times += [now] * len(r.tokens)
        self._emit("accept", r.tokens[: r.accepted])
        self.finished = r.finished
        if r.accepted < len(block.tokens):
            self._emit("reject", block.tokens[r.accepted :])
        if r.next_token is not None:
            kind = "correct" if r.accepted < len(block.tokens) else "bonus"
            self._emit(kind, (r.next_token,))
            # The drafter's context holds drafts past the accepted ones: cut them and
            # append the verifier's token; every block still in flight is now stale.
            self._roll_back(block.start + r.accepted, r.next_token)
            trace.rollbacks += r.new_epoch != self.epoch
        self.epoch = r.new_epoch


async def run_session(
    endpoint: VerifierEndpoint, drafter: Drafter | None, config: SessionConfig, **options: Any
) -> SessionTrace:
    """Generate with `drafter` against `endpoint` until the verifier says finished.
    `options` are `EdgeSession`'s keywords (`depth` 1, `on_event`, `on_rollback`,
    `resume_timeout_s` 0, `resume_backoff_s` 0.2, `on_retry`, `block_len`, `pool`,
    `drafts_off`, `first_plain` False), as follows.

    `config.mode` "sync" forces depth 1. `on_event(kind, tokens)` sees "draft", "accept",
    "correct", "bonus", "reject" (drafts thrown away), "stale" and "resume" as they happen;
    `on_rollback(drafter_state, committed)` sees the drafter after the first round that
    follows a rollback (the round rolls back, then drafts, in one call): its context is the
    committed tokens, then that round's drafts. The next round donates that state: read what
    you need in the call, keep nothing.
    With `resume_timeout_s > 0`, a verifier that becomes unavailable (killed, restarted,
    draining) is retried for that long and the session reopened with its committed tokens:
    the output is exactly that of an uninterrupted run (draws are keyed by position).
    `on_retry(error, resume_timeout_s)` hears once per outage that it is retrying (a command
    says so: the wait is not silent); giving up raises `Unavailable` saying how long it tried.

    `block_len()` (adaptive sessions, `config.draft.adaptive`: `gamma="auto"`) is called
    before each block is drafted and returns its length in [1, config.draft.gamma] (in sync
    mode [0, gamma]: 0 sends an empty block, answered with one token the verifier samples; a
    `ValueError` otherwise); without it every block has `config.draft.gamma` drafts. It may
    read what `on_event` reported so far (accepts, rejects) to choose; one that has
    `observe_draft(n, seconds)` / `observe_result(drafted, accepted, latency_s, step_s)` (an
    `edge.adaptive.AdaptiveGamma`) is also told each block's draft time and answer. In
    pipelined mode the output does not depend on the lengths chosen (every draw is keyed by
    position).

    `config.draft.gamma == 0` is speculation off: no drafter runs (`drafter` may be None),
    each block is empty and the verifier answers it with one token it sampled (a "bonus"
    event); the tokens are plain decoding's. Sync mode sends one block at a time; pipelined
    mode keeps `depth` in flight at consecutive positions (each is answered with exactly one
    token), so the verifier steps them back to back instead of waiting a round trip per
    token: a cloud user's stream.

    `pool` (an `edge.draft_pool.DraftPool`, `drafter` then None or the pool's): the session
    drafts in a row of the pool, batched with the other sessions drafting there (a server's
    sessions on one device); the same tokens as with a drafter of its own.

    `drafts_off()` (a server's load: `edge.openai_server.Backend`) is asked before each
    block of a speculative session; once it says True the session decodes plainly to its
    end: the blocks of drafts in flight are answered, then empty ones follow, as with gamma
    0 (a "plain" event). Every token is still exactly the target's; which tokens a seed
    gives then depends on when drafting stopped.

    `first_plain` (speculative sessions): the first block is empty, so the first token is
    the verifier's own draw (as a server's first token comes from its prefill) and the
    drafter prefills the prompt and that token while it is verified: a first token as soon
    as plain decoding's, the draft's prefill not in front of it. Other tokens for a
    seed than without it (the first one is drawn plainly), each still exactly the target's.
    """
    return await EdgeSession(endpoint, drafter, config, **options).run()
