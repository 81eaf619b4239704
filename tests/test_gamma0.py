"""gamma 0 per request (speculation off): empty blocks through the same verifier and stream,
each answered with one token the verifier samples with plain decoding's draw, so the tokens
are `jaxspec.generate`'s without a draft (issue 20). Over gRPC: tests/test_grpc.py."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

import jaxspec
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.figures import AcceptanceFigures
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.protocol import (
    DraftBlock,
    DraftSpec,
    InvalidArgument,
    SamplingSettings,
    SessionConfig,
    wire,
)
from tests.fixtures import peaked_config, peaked_models
from verify import LocalVerifier, Scheduler

PROMPT, NEW = (1, 2, 3, 4), 16
CONFIG = peaked_config()
pytestmark = pytest.mark.usefixtures("x64")  # float64: exact decisions
models = peaked_models  # the float64 target and draft, random but peaked


def config(gamma=0, temperature=1.0, top_k=0, top_p=1.0, **kw) -> SessionConfig:
    spec = DraftSpec(gamma=gamma, encoding=kw.pop("encoding", "full"), sparse_k=4)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)
    return SessionConfig(prompt=PROMPT, max_new_tokens=NEW, draft=spec, sampling=sampling, **kw)


def plain(cfg: SessionConfig, **kw) -> list[int]:
    """Co-located plain decoding with the session's sampling and seed."""
    c = cfg
    return jaxspec.generate(
        models()[0], list(c.prompt), c.max_new_tokens, sampling=c.sampling, seeds=[c.seed], **kw,
    ).tokens  # fmt: skip


async def _run(verifier, cfg, depth=3, drafter=None):
    return await run_session(verifier, drafter, cfg, depth=depth)


SAMPLED = [
    dict(mode="sync", temperature=1.0, seed=3),
    dict(mode="pipelined", temperature=0.8, top_k=10, top_p=0.9, seed=4),
    dict(mode="pipelined", temperature=0.0, seed=5),
]


@pytest.mark.parametrize("kw", SAMPLED)
def test_a_gamma0_session_is_plain_decoding(kw):
    """No drafter, empty blocks, in sync and pipelined mode: the verifier's tokens are plain
    decoding's (the same draw U(TARGET, position)), and co-located gamma 0 is plain decoding.
    The figures count no draft. Pipelined, `depth` blocks stay in flight at consecutive
    positions (a stream, not a round trip per token)."""
    cfg = config(**kw)

    async def go():
        v = LocalVerifier(models()[0], CONFIG)
        try:
            return await _run(v, cfg)
        finally:
            await v.aclose()

    trace = asyncio.run(go())
    want = plain(cfg)
    assert trace.tokens == want and len(want) == NEW
    colocated = jaxspec.generate(
        models()[0], list(PROMPT), NEW, draft=models()[1], gamma=0, mode=cfg.mode,
        sampling=cfg.sampling, seeds=[cfg.seed],
    )  # fmt: skip
    assert colocated.tokens == want and colocated.stats.figures is None
    # One token per block, nothing stale or rolled back; sync: one block in flight (depth 3
    # asked), pipelined: 3 (the last token's answer leaves two out, never taken).
    ahead = 0 if cfg.mode == "sync" else 2
    assert trace.figures.rounds == NEW and trace.blocks_sent == NEW + ahead
    assert trace.stale == trace.rollbacks == 0
    assert {k for k, _ in trace.events} == {"accept", "bonus"}
    assert trace.figures == AcceptanceFigures(rounds=NEW, emitted=NEW)
    if cfg.sampling.temperature > 0:  # the tokens are draws: another seed's differ (can fail)
        assert plain(dataclasses.replace(cfg, seed=cfg.seed + 100)) != want


def test_a_batch_of_gamma0_blocks_runs_as_a_decode_step():
    """Blocks without drafts alone in a batch run the width-1 step: one position per row and
    no rule (a plain decode step's work, not a verify step's width), with the tokens of the
    verify step's width 3 (the old path) and of plain decoding, penalties included."""
    cfg = config(mode="sync", temperature=0.9, top_k=20, seed=21)
    cfg = dataclasses.replace(
        cfg, sampling=dataclasses.replace(cfg.sampling, repetition_penalty=1.3)
    )
    got = {}
    for widths in ((1, 3, 5), (3, 5)):
        sched = Scheduler(models()[0], dataclasses.replace(CONFIG, width_buckets=widths))

        async def go(sched=sched):
            v = LocalVerifier(scheduler=sched)
            try:
                return await _run(v, cfg)
            finally:
                await v.aclose()

        got[widths] = asyncio.run(go()).tokens, sched.metrics.last_width, sched
    (decode, w1, s1), (verify, w3, s3) = got[(1, 3, 5)], got[(3, 5)]
    assert (w1, w3) == (1, 3)
    assert decode == verify == plain(cfg) and len(decode) == NEW
    rule = "jit(_verify)"  # the rule's ops, by their source
    assert rule not in s1.step_hlo(1, 1, 128) and rule in s3.step_hlo(1, 3, 128)


def test_gamma0_and_speculative_sessions_share_batches():
    """A gamma-0 session and speculative ones (sync full, pipelined sparse) verified in the
    same batches: each gets exactly what it gets alone."""
    t, d = models()
    sched = Scheduler(t, CONFIG)
    batches = []
    build = sched._build_batch

    def spy(rows, blocks, R, W, A):
        batches.append(sorted(len(b.tokens) for b in blocks))
        return build(rows, blocks, R, W, A)

    sched._build_batch = spy
    plain_cfg = config(mode="pipelined", temperature=1.0, seed=11)
    sync_cfg = config(gamma=3, mode="sync", temperature=1.0, seed=12)
    pipe_cfg = config(gamma=4, mode="pipelined", encoding="sparse", temperature=0.8, seed=13)

    async def go():
        v = LocalVerifier(scheduler=sched)
        try:
            return await asyncio.gather(
                _run(v, plain_cfg),
                _run(v, sync_cfg, drafter=Drafter(d, sync_cfg.draft)),
                _run(v, pipe_cfg, depth=2, drafter=Drafter(d, pipe_cfg.draft)),
            )
        finally:
            await v.aclose()

    got_plain, got_sync, got_pipe = asyncio.run(go())
    assert got_plain.tokens == plain(plain_cfg)
    for cfg, got in ((sync_cfg, got_sync), (pipe_cfg, got_pipe)):
        s = cfg.draft
        ref = plain(cfg, draft=d, gamma=s.gamma, mode=cfg.mode, encoding=s.encoding, sparse_k=4)
        assert got.tokens == ref
    assert any(b[0] == 0 and b[-1] > 0 for b in batches), batches  # mixed in one step


def test_gamma0_is_checked_everywhere():
    """gamma 0 is a valid spec (never adaptive); its blocks carry nothing; a speculative
    session's blocks hold 0..gamma drafts (0: it stopped drafting, `drafts_off`); gamma 0
    survives the wire."""
    assert not DraftSpec(gamma=0).speculative and DraftSpec(gamma=1).speculative
    for bad in (dict(gamma=-1), dict(gamma=0, adaptive=True)):
        with pytest.raises(InvalidArgument):
            DraftSpec(**bad)
    cfg = config(mode="pipelined")
    assert wire.config_from_proto(wire.config_to_proto(cfg)) == cfg
    empty = wire.block_from_proto(pb.DraftBlock(session_id="s", epoch=0, start=4))
    assert (empty.tokens, empty.q, empty.q_ids) == ((), None, None)

    sched = Scheduler(models()[0], CONFIG)
    sid = sched.open(cfg).session_id
    spec_sid = sched.open(config(gamma=2)).session_id
    block = DraftBlock(session_id=sid, epoch=0, start=4, tokens=())
    for kw in (dict(tokens=(5,), q=np.full((1, 64), 1 / 64)), dict(q=np.zeros((0, 64)))):
        with pytest.raises(InvalidArgument):
            sched.submit(dataclasses.replace(block, **kw))
    three = dict(tokens=(1, 2, 3), q=np.full((3, 64), 1 / 64))  # past the session's gamma
    with pytest.raises(InvalidArgument, match=r"0\.\.2 drafts"):
        sched.submit(dataclasses.replace(block, session_id=spec_sid, **three))
    sched.submit(block)
    results = []
    while sched.sessions[sid].queue:
        results += sched.tick()
    ((_, r),) = results
    assert len(r.tokens) == 1 and r.next_token == r.tokens[0] and r.accepted == 0
    assert r.new_epoch == 0 and r.figures == AcceptanceFigures(rounds=1, emitted=1)  # no drafts
    assert r.tokens[0] == plain(dataclasses.replace(cfg, max_new_tokens=1))[0]
