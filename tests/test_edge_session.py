"""The edge session against the in-process verifier, through a simulated WAN."""

from __future__ import annotations

import asyncio
import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxspec
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import EdgeSession, run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from tests.fixtures import peaked_models, peaked_scheduler
from tests.mutants import injected
from verify import LocalVerifier, Scheduler, SchedulerConfig

PROMPT, NEW = (1, 2, 3, 4), 16


pytestmark = pytest.mark.usefixtures("x64")  # float64: exact decisions
models = peaked_models  # the float64 target and draft, random but peaked


@functools.cache
def scheduler():
    return peaked_scheduler()


def session(
    mode, gamma, depth, temperature=1.0, encoding="full", delays=None, seed=3, on_rollback=None,
    adaptive=False, block_len=None, penalties=None, sched=None,
):  # fmt: skip
    cfg = SessionConfig(
        prompt=PROMPT,
        max_new_tokens=NEW,
        mode=mode,
        sampling=SamplingSettings(temperature=temperature, **(penalties or {})),
        seed=seed,
        draft=DraftSpec(gamma=gamma, encoding=encoding, sparse_k=4, adaptive=adaptive),
    )
    drafter = Drafter(models()[1], cfg.draft)

    async def go():
        v = LocalVerifier(scheduler=sched or scheduler())
        ep = v if delays is None else DelayedEndpoint(v, delays=delays, one_way_s=0.0)
        try:
            return await run_session(
                ep, drafter, cfg, depth=depth, on_rollback=on_rollback, block_len=block_len
            )
        finally:
            await v.aclose()

    return asyncio.run(go())


# The verifier ticks in a worker thread: it must run in float64 too, not truncate to float32.
@pytest.mark.filterwarnings("error:Explicitly requested dtype float64")
@pytest.mark.parametrize(
    ("mode", "encoding", "temperature"),
    [("sync", "full", 1.0), ("pipelined", "sparse", 0.8), ("pipelined", "onehot", 0.0)],
)
def test_edge_cloud_equals_colocated_speculative(mode, encoding, temperature):
    """The edge drafter + verifier over the protocol produce exactly what co-located
    speculative decoding produces (same draws), sampled too."""
    t, d = models()
    trace = session(mode, 3, 2, temperature, encoding)
    ref = jaxspec.generate(
        t,
        list(PROMPT),
        NEW,
        draft=d,
        gamma=3,
        mode=mode,
        encoding=encoding,
        sparse_k=4,
        temperature=temperature,
        seeds=[3],
    )
    assert trace.tokens == ref.tokens
    assert trace.figures.rounds > 0 and trace.figures.acceptance_rate < 1
    assert trace.figures.acceptance_rate > 0 or temperature == 0.0  # random greedy drafts miss
    if temperature == 0.0:
        assert trace.tokens == jaxspec.generate(t, list(PROMPT), NEW, temperature=0.0).tokens


@settings(max_examples=12, deadline=None)
@given(
    depth=st.integers(1, 8),
    gamma=st.integers(1, 4),
    delays=st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.004, 0.02]), max_size=40),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_pipelined_output_is_independent_of_depth_and_delays(depth, gamma, delays, temperature):
    base = session("pipelined", gamma, 1, temperature)
    got = session("pipelined", gamma, depth, temperature, delays=delays)
    assert got.tokens == base.tokens and len(got.tokens) == NEW
    if temperature == 0.0:
        plain = jaxspec.generate(models()[0], list(PROMPT), NEW, temperature=0.0).tokens
        assert got.tokens == plain


def test_every_rollback_leaves_the_drafter_as_if_built_from_scratch():
    _, d = models()
    fresh_drafter = Drafter(d, DraftSpec(gamma=3))
    checked = []

    def check(state, committed):  # after the round that rolled back: committed, then drafts
        n = len(committed)
        assert int(state.length[0]) > n
        np.testing.assert_array_equal(np.asarray(state.tokens[0, :n]), committed)
        fresh = fresh_drafter.prefill(fresh_drafter.init(1, state.tokens.shape[1]), [committed])
        kv = int(min(state.cache.lengths[0], fresh.cache.lengths[0]))
        assert kv >= n - 2  # at most the last two positions await their KV
        np.testing.assert_allclose(state.cache.k[:, 0, :kv], fresh.cache.k[:, 0, :kv], atol=1e-9)
        np.testing.assert_allclose(state.cache.v[:, 0, :kv], fresh.cache.v[:, 0, :kv], atol=1e-9)
        checked.append(n)

    trace = session("pipelined", 3, 4, 1.0, on_rollback=check)
    # Each rollback is seen by the round after it: the last one may end the session.
    assert trace.rollbacks > 0 and len(checked) >= trace.rollbacks - 1
    assert trace.stale > 0  # blocks in flight behind a rejection were dropped


def test_sync_mode_is_depth_one_with_bonus_tokens():
    trace = session("sync", 2, 5, 0.0)
    assert trace.stale == 0
    kinds = {k for k, _ in trace.events}
    assert {"draft", "accept", "correct"} <= kinds


def test_the_trace_splits_the_sessions_time():
    """`SessionTrace.stalls()`: drafting (kept, thrown away), waiting (the verifier's step,
    the wire and hops, stale answers) and host time add up to the wall time, each >= 0; a
    pipelined session that rejects throws drafting away and waits for stale answers, and
    its blocks' answers waited through the verifier's step."""
    trace = session("pipelined", 3, 3, 1.0)
    parts = trace.stalls()
    assert set(parts) == {
        "draft_kept", "draft_wasted", "wait_step", "wait_wire", "wait_stale", "host"
    }  # fmt: skip
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(trace.end_time - trace.start_time)
    assert trace.stale > 0 and parts["wait_stale"] > 0 and parts["draft_wasted"] > 0
    assert parts["wait_step"] > 0 and parts["draft_kept"] > 0


@pytest.mark.parametrize("encoding", ["full", "sparse"])
def test_adaptive_blocks_of_any_length_give_colocated_pipelined_tokens(encoding):
    """gamma="auto": the edge picks each block's length in [1, gamma] (a fixed cycle here,
    standing in for a controller). The verifier takes every length, and pipelined (no bonus)
    the output is co-located decoding's, whatever the lengths: each position's token is the
    draft or correction drawn for that position."""
    t, d = models()
    lengths = itertools.cycle([1, 4, 2, 3, 3, 1, 4])
    asked = []

    def block_len():
        asked.append(next(lengths))
        return asked[-1]

    trace = session("pipelined", 4, 2, 1.0, encoding, adaptive=True, block_len=block_len)
    kw = dict(mode="pipelined", encoding=encoding, sparse_k=4, seeds=[3])
    ref = jaxspec.generate(t, list(PROMPT), NEW, draft=d, gamma=3, **kw)
    assert trace.tokens == ref.tokens and len(trace.tokens) == NEW
    sent = [len(toks) for kind, toks in trace.events if kind == "draft"]
    assert sent == asked and set(sent) == {1, 2, 3, 4}
    assert trace.rollbacks > 0  # rejections happened: the lengths met real rollbacks


def test_block_len_is_checked():
    """A length outside [1, gamma] ([0, gamma] in sync mode: 0 stops drafting), or a hook on
    a spec that is not adaptive, is refused."""
    for mode, bad in (("sync", 5), ("sync", -1), ("pipelined", 0), ("pipelined", 5)):
        with pytest.raises(ValueError, match="block_len"):
            session(mode, 4, 1, adaptive=True, block_len=lambda bad=bad: bad)
    with pytest.raises(ValueError, match="adaptive"):
        session("sync", 4, 1, block_len=lambda: 2)


def test_an_edge_session_keeps_its_state_and_runs_once():
    """`EdgeSession` is what `run_session` runs: the same tokens, its state readable after
    the run (the committed tokens are the prompt and the trace's tokens), and a second
    `run()` is refused rather than continuing from a closed session."""
    spec = DraftSpec(gamma=3, encoding="full", sparse_k=4)
    cfg = SessionConfig(
        prompt=PROMPT, max_new_tokens=NEW, mode="pipelined", seed=3, draft=spec,
        sampling=SamplingSettings(temperature=1.0),
    )  # fmt: skip

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        try:
            s = EdgeSession(v, Drafter(models()[1], spec), cfg, depth=2)
            trace = await s.run()
            with pytest.raises(RuntimeError, match="runs once"):
                await s.run()
            return s, trace
        finally:
            await v.aclose()

    s, trace = asyncio.run(go())
    assert trace is s.trace and s.finished
    assert s.committed == [*PROMPT, *trace.tokens]
    assert trace.tokens == session("pipelined", 3, 2).tokens


def test_a_message_cancelled_in_flight_does_not_stall_the_link():
    """A block abandoned mid-flight (its session ended) must not hold back later messages."""

    class Echo:
        async def verify(self, block):
            return block

    async def go():
        ep = DelayedEndpoint(Echo(), delays=[0.3, 0.0, 0.0])
        first = asyncio.ensure_future(ep.verify("a"))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(ep.verify("b"))
        await asyncio.sleep(0.05)
        first.cancel()
        return await asyncio.wait_for(second, 5)

    assert asyncio.run(go()) == "b"


PENALTIES = {"repetition_penalty": 1.7, "presence_penalty": 0.6, "frequency_penalty": 0.4}


@pytest.mark.parametrize(("mode", "depth"), [("sync", 1), ("pipelined", 3)])
def test_penalties_edge_cloud_equal_colocated(mode, depth):
    """With penalties, the edge (counts from its own context, drafts in flight included)
    and the verifier (per-slot counts on device, rolled back on rejection) produce what
    co-located decoding produces, which tests/test_penalties.py fits to the exact law."""
    t, d = models()
    trace = session(mode, 3, depth, penalties=PENALTIES)
    ref = jaxspec.generate(
        t, list(PROMPT), NEW, draft=d, gamma=3, mode=mode, seeds=[3], **PENALTIES
    )
    assert trace.tokens == ref.tokens
    assert trace.figures.rounds > 0 and 0 < trace.figures.acceptance_rate < 1  # rejections happened
    plain = jaxspec.generate(t, list(PROMPT), NEW, seeds=[3]).tokens
    assert trace.tokens != plain or mode == "sync"  # (the penalties change the output)


def test_verifier_counts_not_rolled_back_is_caught():
    """The verifier mutant that keeps counting a block's rejected drafts leaves the
    co-located tokens: the equality above catches it."""
    t, d = models()
    config = SchedulerConfig(max_sessions=4, max_len=128, max_gamma=4, row_buckets=(1, 2, 4))
    with injected("verifier_counts_not_rolled_back"):
        trace = session("sync", 3, 1, penalties=PENALTIES, sched=Scheduler(t, config))
    ref = jaxspec.generate(t, list(PROMPT), NEW, draft=d, gamma=3, seeds=[3], **PENALTIES)
    assert trace.tokens != ref.tokens


def test_slot_counts_follow_the_committed_tokens():
    """After every verified block, a penalized session's slot counts are exactly its
    prompt and committed tokens (rejected drafts rolled back)."""
    sched = Scheduler(
        models()[0],
        SchedulerConfig(max_sessions=4, max_len=128, max_gamma=4, row_buckets=(1, 2, 4)),
    )
    checked = []
    tick = sched.tick

    def checking_tick():
        out = tick()
        for s in sched.sessions.values():
            if s.penalized and s.figures.rounds:
                out_counts = np.bincount(s.tokens[s.prompt_len :], minlength=sched.vocab)
                np.testing.assert_array_equal(np.asarray(sched.counts.output[s.slot]), out_counts)
                in_prompt = np.isin(np.arange(sched.vocab), s.tokens[: s.prompt_len])
                np.testing.assert_array_equal(np.asarray(sched.counts.prompt[s.slot]), in_prompt)
                checked.append(s.figures.rounds)
        return out

    sched.tick = checking_tick
    trace = session("pipelined", 3, 2, penalties=PENALTIES, sched=sched)
    assert checked and trace.figures.acceptance_rate < 1
