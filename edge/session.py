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

The session runs against any `VerifierEndpoint` (in-process, gRPC, or
`edge.delayed.DelayedEndpoint`, which simulates a WAN).
"""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edge.drafter import DraftBatch, Drafter
from jaxspec.protocol import (
    AcceptanceFigures,
    DraftBlock,
    SessionConfig,
    Unavailable,
    VerifierEndpoint,
    VerifyResult,
)
from jaxspec.sampling import SamplingParams, session_key
from jaxspec.shapes import bucket


@dataclasses.dataclass
class SessionTrace:
    """What a session did: tokens, timings and counters (for metrics, the demo, benchmarks)."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    token_times: list[float] = dataclasses.field(default_factory=list)  # commit wall times
    blocks_sent: int = 0
    stale: int = 0
    rollbacks: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    resumes: int = 0  # sessions reopened after the verifier went away
    start_time: float = 0.0
    end_time: float = 0.0
    events: list[tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    # The verifier's acceptance totals for this session (vLLM's figures, summed over the
    # sessions a resume opened): what the last answered block carried.
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

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
    `q_dtype` adds the scale of each draft, `[gamma]`)."""
    q = batch.q
    probs = None if q.encoding == "onehot" else np.asarray(q.probs[0], np.float64)
    return DraftBlock(
        session_id=session_id,
        epoch=epoch,
        start=int(batch.start[0]),
        tokens=tuple(int(t) for t in np.asarray(batch.tokens[0])),
        q=probs,
        q_ids=np.asarray(q.ids[0]) if q.encoding == "sparse" else None,
        q_scale=None if q.scale is None else np.asarray(q.scale[0], np.float32),
    )


async def run_session(
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
) -> SessionTrace:
    """Generate with `drafter` against `endpoint` until the verifier says finished.

    `config.mode` "sync" forces depth 1. `on_event(kind, tokens)` sees "draft", "accept",
    "correct", "bonus", "reject" (drafts thrown away), "stale" and "resume" as they happen;
    `on_rollback(drafter_state, committed)` sees the drafter right after each rollback.
    With `resume_timeout_s > 0`, a verifier that becomes unavailable (killed, restarted,
    draining) is retried for that long and the session reopened with its committed tokens:
    the output is exactly that of an uninterrupted run (draws are keyed by position).
    `on_retry(error, resume_timeout_s)` hears once per outage that it is retrying (a command
    says so: the wait is not silent); giving up raises `Unavailable` saying how long it tried.

    `block_len()` (adaptive sessions, `config.draft.adaptive`: `gamma="auto"`) is called
    before each block is drafted and returns its length in [1, config.draft.gamma] (a
    `ValueError` otherwise); without it every block has `config.draft.gamma` drafts. It may
    read what `on_event` reported so far (accepts, rejects) to choose; one that has
    `observe_draft(n, seconds)` / `observe_result(drafted, accepted, latency_s, step_s)` (an
    `edge.adaptive.AdaptiveGamma`) is also told each block's draft time and answer. In
    pipelined mode the output does not depend on the lengths chosen (every draw is keyed by
    position).

    `config.draft.gamma == 0` is speculation off: no drafter runs (`drafter` may be None),
    each block is empty and the verifier answers it with one token it sampled (a "bonus"
    event), one block at a time in either mode; the tokens are plain decoding's.
    """
    speculative = config.draft.speculative
    if speculative and (drafter is None or drafter.spec != config.draft):
        have = None if drafter is None else drafter.spec
        raise ValueError(f"the drafter's {have} must match the session's draft {config.draft}")
    if block_len is not None and not config.draft.adaptive:
        raise ValueError("block_len needs an adaptive draft spec (gamma='auto')")
    if config.mode == "sync" or not speculative:  # gamma 0: nothing to draft ahead
        depth = 1
    if depth < 1:
        raise ValueError("depth must be >= 1")
    trace = SessionTrace(start_time=time.perf_counter())

    def emit(kind: str, toks) -> None:
        trace.events.append((kind, tuple(int(t) for t in toks)))
        if on_event is not None:
            on_event(kind, tuple(int(t) for t in toks))

    async def open_session(cfg: SessionConfig) -> str:
        give_up = time.monotonic() + resume_timeout_s
        told = False
        while True:
            try:
                return (await endpoint.open_session(cfg)).session_id
            except Unavailable as e:
                if time.monotonic() + resume_backoff_s > give_up:
                    if not told:
                        raise
                    raise Unavailable(f"{e} (gave up after {resume_timeout_s:g} s)") from None
                if not told and on_retry is not None:
                    on_retry(e, resume_timeout_s)
                told = True
                await asyncio.sleep(resume_backoff_s)

    sid = await open_session(config)
    prompt = list(config.prompt)
    gamma = config.draft.gamma  # the longest block
    need = len(prompt) + config.max_new_tokens + (depth + 1) * gamma + 2
    max_len = bucket(need, 64)  # sessions share compilations
    state = drafter.prefill(drafter.init(1, max_len), [prompt]) if speculative else None

    def roll_back(length: int, token: int | None = None) -> None:
        """Cut the drafter's context to `length` tokens (then append `token`)."""
        nonlocal state
        if not speculative:
            return
        state = drafter.rollback(state, [0], [length])
        if token is not None:
            state = drafter.append(state, [0], [[token]])
        if on_rollback is not None:
            on_rollback(state, committed)

    sampling = SamplingParams.make(
        1, config.temperature, config.top_k, config.top_p, config.min_p,
        dict(config.logit_bias), None, config.repetition_penalty, config.presence_penalty,
        config.frequency_penalty,
    )  # fmt: skip
    keys = session_key(config.seed, 0)[None]

    committed = list(prompt)
    epoch = 0
    before_resume = AcceptanceFigures()  # the figures of the sessions a resume closed
    inflight: list[tuple[DraftBlock, asyncio.Task[VerifyResult]]] = []
    # A `block_len` that measures (`edge.adaptive.AdaptiveGamma`) hears each block's draft
    # time and, when it is answered, how many drafts were accepted and how long it took.
    observe_draft = getattr(block_len, "observe_draft", None)
    observe_result = getattr(block_len, "observe_result", None)
    sent_at: dict[int, float] = {}  # id(block) -> when it went out
    behind = False  # an empty block was sent: the draft's KV lags its context
    finished = False
    try:
        while not finished:
            # Keep `depth` blocks in flight, drafting along the optimistic path.
            while len(inflight) < depth and not speculative:
                block = DraftBlock(session_id=sid, epoch=epoch, start=len(committed), tokens=())
                inflight.append((block, asyncio.ensure_future(endpoint.verify(block))))
                trace.blocks_sent += 1
            while speculative and len(inflight) < depth and int(state.length[0]) + gamma <= max_len:
                n = gamma if block_len is None else operator.index(block_len())
                low = 0 if config.mode == "sync" else 1  # 0: stop drafting (sync only)
                if not low <= n <= gamma:
                    raise ValueError(f"block_len() must be in [{low}, {gamma}], got {n}")
                if n == 0:  # no drafting: the verifier samples the token (edge.adaptive)
                    block = DraftBlock(session_id=sid, epoch=epoch, start=len(committed), tokens=())
                    sent_at[id(block)] = time.perf_counter()
                    inflight.append((block, asyncio.ensure_future(endpoint.verify(block))))
                    trace.blocks_sent += 1
                    behind = True
                    continue
                if behind:  # tokens came while nothing drafted: rebuild the draft's KV
                    state = drafter.prefill(state, [committed], prompt_len=[len(prompt)])
                    behind = False
                t_draft = time.perf_counter()
                state, batch = drafter.draft(state, sampling, keys, gamma=n)
                block = _to_wire(batch, sid, epoch)  # waits for the drafts: timed whole
                sent_at[id(block)] = time.perf_counter()
                if observe_draft is not None:
                    observe_draft(n, sent_at[id(block)] - t_draft)
                inflight.append((block, asyncio.ensure_future(endpoint.verify(block))))
                trace.blocks_sent += 1
                emit("draft", block.tokens)
            block, task = inflight.pop(0)
            sent = sent_at.pop(id(block), None)
            try:
                r = await task
            except Unavailable:
                if resume_timeout_s <= 0:
                    raise
                # Resume: drop what was in flight, reopen with the committed tokens (epoch
                # 0 again) and redraft from the committed prefix.
                for _, t in inflight:
                    t.cancel()
                inflight.clear()
                sent_at.clear()
                await endpoint.close_session(sid)
                before_resume = trace.figures
                done = tuple(committed[len(prompt) :])
                sid = await open_session(dataclasses.replace(config, committed=done))
                epoch = 0
                if speculative:
                    state = drafter.rollback(state, [0], [len(committed)])
                trace.resumes += 1
                emit("resume", ())
                continue
            trace.figures = before_resume + r.figures
            if r.stale:
                trace.stale += 1
                emit("stale", block.tokens)
                if r.epoch == epoch and block.start == len(committed):
                    raise RuntimeError("the verifier dropped a current block as stale")
                if not inflight or r.epoch == epoch:
                    # Nothing valid is in flight: redraft from the committed prefix.
                    roll_back(len(committed))
                finished = r.finished
                continue
            trace.rounds += 1
            trace.drafted += len(block.tokens)
            trace.accepted += r.accepted
            now = time.perf_counter()
            if observe_result is not None and sent is not None:
                observe_result(len(block.tokens), r.accepted, now - sent, r.step_s)
            committed += r.tokens
            trace.tokens += r.tokens
            trace.token_times += [now] * len(r.tokens)
            emit("accept", r.tokens[: r.accepted])
            finished = r.finished
            if r.accepted < len(block.tokens):
                emit("reject", block.tokens[r.accepted :])
            if r.next_token is not None:
                emit("correct" if r.accepted < len(block.tokens) else "bonus", (r.next_token,))
                # The drafter's context holds drafts past the accepted ones: cut them and
                # append the verifier's token; every block still in flight is now stale.
                roll_back(block.start + r.accepted, r.next_token)
                trace.rollbacks += r.new_epoch != epoch
            epoch = r.new_epoch
    finally:
        for _, task in inflight:
            task.cancel()
        await endpoint.close_session(sid)
        trace.end_time = time.perf_counter()
    return trace
