"""The draft pool (`edge.draft_pool`): sessions on one device drafting in one call a round.

Several sessions at once (modes, encodings, penalties, adaptive block lengths, prompts of
different lengths, seeds) drafting in one pool commit exactly the tokens each commits with a
drafter of its own, while the pool drafts their blocks in fewer calls than blocks; the pool
grows (rows and positions) as sessions come, and a session cancelled mid-answer gives its row
back without touching the others'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools

import pytest

from edge.draft_pool import DraftPool
from edge.drafter import Drafter
from edge.session import EdgeSession
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from tests.fixtures import peaked_models, peaked_scheduler
from verify import LocalVerifier

NEW = 14


pytestmark = pytest.mark.usefixtures("x64")  # float64: exact decisions
models = peaked_models  # the float64 target and draft, random but peaked


@functools.cache
def scheduler():
    return peaked_scheduler(8, (1, 2, 4, 8))


def configs(spec: DraftSpec, mode: str) -> list[SessionConfig]:
    """Sessions that differ in every way a pool must keep apart."""
    penalties = ({}, {"repetition_penalty": 1.3, "frequency_penalty": 0.5})
    return [
        SessionConfig(
            prompt=tuple(range(1, 2 + 3 * i)),
            max_new_tokens=NEW + i,
            mode=mode,
            sampling=SamplingSettings(temperature=(1.0, 0.7, 0.0)[i % 3], **penalties[i % 2]),
            seed=10 + i,
            draft=spec,
        )
        for i in range(4)
    ]


def _lengths(i: int):
    """Block lengths of their own for session `i`, 0 among them (sync: no drafting, the
    verifier samples; the row is prefilled again before the next block)."""
    return itertools.cycle((4, 0, 2, 1, 3, 0)[i:] + (4, 0, 2, 1, 3, 0)[:i]).__next__


def run(cfgs: list[SessionConfig], pool: DraftPool | None, adaptive: bool = False) -> list:
    """Every session at once against one verifier, in the pool or each alone."""
    spec = cfgs[0].draft

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        try:
            own = None if pool or not spec.speculative else Drafter(models()[1], spec)
            lengths = [_lengths(i) if adaptive else None for i in range(len(cfgs))]
            sessions = [
                EdgeSession(v, own, c, depth=2, pool=pool, block_len=n)
                for c, n in zip(cfgs, lengths, strict=True)
            ]
            return await asyncio.gather(*(s.run() for s in sessions))
        finally:
            await v.aclose()

    return [t.tokens for t in asyncio.run(go())]


@pytest.mark.parametrize(
    ("mode", "encoding", "adaptive"),
    [("pipelined", "full", False), ("sync", "sparse", False), ("sync", "full", True)],
)
def test_pooled_sessions_commit_what_they_commit_alone(mode, encoding, adaptive):
    spec = DraftSpec(gamma=4, encoding=encoding, sparse_k=4, adaptive=adaptive)
    cfgs = configs(spec, mode)
    alone = run(cfgs, None, adaptive)
    grows = mode == "pipelined"  # from 1 row of 16 positions (each size compiles anew)
    pool = DraftPool(Drafter(models()[1], spec), rows=1 if grows else 4, max_len=16)
    assert run(cfgs, pool, adaptive) == alone
    assert all(len(t) >= 1 for t in alone)
    assert pool.rows == 4 and pool.max_len >= 64 and sorted(pool.free) == [0, 1, 2, 3]
    assert pool.calls < pool.batched  # blocks of several sessions drafted in one call


def test_a_cancelled_session_gives_its_row_back():
    """A session cancelled while its round waits: its row is free again, its request gone,
    and the other sessions' tokens are those they commit alone."""
    spec = DraftSpec(gamma=4)
    cfgs = configs(spec, "pipelined")
    alone = run(cfgs[1:], None)
    pool = DraftPool(Drafter(models()[1], spec), rows=4, max_len=64)

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        try:
            doomed = asyncio.ensure_future(EdgeSession(v, None, cfgs[0], pool=pool).run())
            others = [EdgeSession(v, None, c, depth=2, pool=pool) for c in cfgs[1:]]
            tasks = [asyncio.ensure_future(s.run()) for s in others]
            while pool.batched < 3:
                await asyncio.sleep(0.01)
            doomed.cancel()
            return [t.tokens for t in await asyncio.gather(*tasks)]
        finally:
            await v.aclose()

    assert asyncio.run(go()) == alone
    assert sorted(pool.free) == [0, 1, 2, 3] and not pool.pending


def test_pool_checks_its_arguments():
    spec = DraftSpec(gamma=2)
    pool = DraftPool(Drafter(models()[1], spec), rows=2, max_len=64)
    row = pool.open(64)
    with pytest.raises(ValueError, match="context"):
        pool.prefill(row, [], 0)
    with pytest.raises(ValueError, match=r"1\.\.2"):
        asyncio.run(pool.round(row, 1, (), 3, SamplingSettings(), [0, 0], "s", 0))
    with pytest.raises(ValueError, match="pool's drafter"):
        EdgeSession(None, Drafter(models()[1], spec), configs(spec, "sync")[0], pool=pool)


@pytest.mark.parametrize("first_plain", [False, True])
def test_sessions_that_stop_or_start_drafting_late_commit_plain_decodings_tokens(first_plain):
    """`drafts_off` (a loaded server) turning True after a few blocks: each pipelined session
    finishes its blocks of drafts in flight, then sends empty ones; greedy, it commits plain
    decoding's tokens, gives its pool row back at once and drafts nothing more.
    `first_plain` (a server's sessions): the first block is empty, the verifier's token comes
    first, drafting (the row's prefill) after it; greedy, plain decoding's tokens again."""
    spec = DraftSpec(gamma=4)
    cfgs = [
        dataclasses.replace(c, sampling=dataclasses.replace(c.sampling, temperature=0.0))
        for c in configs(spec, "pipelined")
    ]
    plain = run([dataclasses.replace(c, draft=DraftSpec(gamma=0)) for c in cfgs], None)
    pool = DraftPool(Drafter(models()[1], spec), rows=4, max_len=64)
    asked = itertools.count()
    off = None if first_plain else lambda: next(asked) >= 6  # the load rises after 6 blocks

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        try:
            sessions = [
                EdgeSession(v, None, c, depth=2, pool=pool, drafts_off=off, first_plain=first_plain)
                for c in cfgs
            ]
            traces = await asyncio.gather(*(s.run() for s in sessions))
            return traces, scheduler().metrics.last_width
        finally:
            await v.aclose()

    traces, last_width = asyncio.run(go())
    assert [t.tokens for t in traces] == plain
    for t in traces:
        kinds = [k for k, _ in t.events]
        if first_plain:  # one token from the verifier, then blocks of drafts
            assert kinds[:3] == ["accept", "bonus", "draft"] and "plain" not in kinds
        else:
            assert kinds.count("plain") == 1 and "draft" not in kinds[kinds.index("plain") :]
    if not first_plain:
        assert last_width == 1  # the last steps verify single tokens, not padded blocks
    assert sorted(pool.free) == [0, 1, 2, 3] and pool.batched >= 1
