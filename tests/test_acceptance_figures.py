"""Acceptance figures per request (issue 20): every VerifyResult carries its session's totals
as vLLM counts them, the edge's trace returns them, and the metrics export them per tenant
under vLLM's names. Over gRPC (the service's own counters): tests/test_grpc.py."""

from __future__ import annotations

import asyncio
import functools
import itertools

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig, wire
from tests.fixtures import Recorder, peaked_config, peaked_models, peaked_scheduler
from verify import LocalVerifier, Scheduler
from verify.metrics import ServiceMetrics

PROMPT, NEW = (1, 2, 3, 4), 20
CONFIG = peaked_config()
pytestmark = pytest.mark.usefixtures("x64")  # float64: exact decisions
models = peaked_models  # the float64 target and draft, random but peaked


@functools.cache
def scheduler() -> Scheduler:
    return peaked_scheduler()


def expected(pairs, gamma: int) -> AcceptanceFigures:
    """vLLM's figures computed from the answers themselves: non-stale blocks only."""
    done = [(b, r) for b, r in pairs if not r.stale]
    per_pos = [0] * gamma
    for _, r in done:
        for j in range(r.accepted):
            per_pos[j] += 1
    return AcceptanceFigures(
        num_drafts=sum(len(b.tokens) > 0 for b, _ in done),
        num_draft_tokens=sum(len(b.tokens) for b, _ in done),
        num_accepted_tokens=sum(r.accepted for _, r in done),
        accepted_per_position=tuple(per_pos),
        rounds=len(done),
        emitted=sum(len(r.tokens) for _, r in done),
    )


def config(mode, gamma, encoding="full", seed=3, temperature=1.0) -> SessionConfig:
    spec = DraftSpec(gamma=gamma, encoding=encoding, sparse_k=4)
    return SessionConfig(
        prompt=PROMPT, max_new_tokens=NEW, mode=mode, seed=seed, draft=spec,
        sampling=SamplingSettings(temperature=temperature),
    )  # fmt: skip


def run(ep, cfg, depth=3, **kw):
    return run_session(ep, Drafter(models()[1], cfg.draft), cfg, depth=depth, **kw)


@pytest.mark.parametrize(
    ("mode", "gamma", "encoding"), [("sync", 3, "full"), ("pipelined", 4, "sparse")]
)
def test_every_result_carries_its_sessions_running_totals(mode, gamma, encoding):
    """After each answer (stale ones too) the figures are the totals of the answers so far;
    the trace returns the last, and they agree with the trace's tokens."""
    cfg = config(mode, gamma, encoding)

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        rec = Recorder(v)
        try:
            return await run(rec, cfg), rec.seen
        finally:
            await v.aclose()

    trace, seen = asyncio.run(go())
    for i, (_, r) in enumerate(seen):
        assert r.figures == expected(seen[: i + 1], gamma), i
        assert wire.result_from_proto(wire.result_to_proto(r)) == r  # and over the wire
    f = trace.figures
    assert f == seen[-1][1].figures == expected(seen, gamma)
    assert f.num_drafts == f.rounds == sum(not r.stale for _, r in seen)
    assert f.emitted == len(trace.tokens) and f.tokens_per_round == len(trace.tokens) / f.rounds
    assert 0 < f.acceptance_rate < 1
    assert sum(f.accepted_per_position) == f.num_accepted_tokens
    p = f.accepted_per_position  # acceptance is a prefix of the block: never rises
    assert len(p) == gamma and all(a >= b for a, b in itertools.pairwise(p))
    assert f.mean_acceptance_length == 1 + f.num_accepted_tokens / f.num_drafts
    if mode == "pipelined":
        assert trace.stale > 0  # stale answers were among those checked


def test_figures_add_up_over_a_resume():
    """A verifier that goes away mid-session: the reopened session counts from zero, the
    trace's figures are the sum of both sessions'."""
    cfg = config("sync", 3, seed=8)

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        rec = Recorder(v, fail_at=4)
        try:
            return await run(rec, cfg, resume_timeout_s=5.0, resume_backoff_s=0.0), rec.seen
        finally:
            await v.aclose()

    trace, seen = asyncio.run(go())
    assert trace.resumes == 1
    after = seen[3][1].figures  # the reopened session's first answer
    assert after.num_draft_tokens == 3 and after.num_drafts == 1
    assert trace.figures == expected(seen, 3) != seen[-1][1].figures


def scrape(registry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_export_vllms_counters_per_tenant():
    """Two tenants' sessions counted block by block as the service counts them: per tenant,
    vLLM's four counters (per position labelled) equal that tenant's figures; a gamma-0
    session moves none of them."""
    idle = dict(sessions=0, queued_blocks=0, steps=0, mean_occupancy=0.0, serving=True)
    m = ServiceMetrics(lambda: idle, CONFIG.row_buckets)
    cfgs = {"alice": config("pipelined", 4, seed=21), "bob": config("sync", 2, seed=22)}
    plain = SessionConfig(prompt=PROMPT, max_new_tokens=6, draft=DraftSpec(gamma=0), seed=23)

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        recs = {t: Recorder(v.for_tenant(t)) for t in (*cfgs, "carol")}
        try:
            traces = await asyncio.gather(
                *(run(recs[t], c) for t, c in cfgs.items()),
                run_session(recs["carol"], None, plain),
            )
        finally:
            await v.aclose()
        for t, rec in recs.items():
            for b, r in rec.seen:
                if r.stale:
                    m.count_stale(t)
                else:
                    n, accepted = len(b.tokens), r.accepted
                    m.count_round(t, AcceptanceFigures.of_round(n, accepted, len(r.tokens)))
        return dict(zip((*cfgs, "carol"), traces, strict=True))

    traces = asyncio.run(go())
    got = scrape(m.registry)

    def value(name, **labels):
        return got.get((f"vllm:spec_decode_{name}_total", frozenset(labels.items())), 0.0)

    for tenant in cfgs:
        f = traces[tenant].figures
        assert f.num_drafts > 0
        assert value("num_drafts", tenant=tenant) == f.num_drafts
        assert value("num_draft_tokens", tenant=tenant) == f.num_draft_tokens
        assert value("num_accepted_tokens", tenant=tenant) == f.num_accepted_tokens
        for pos, n in enumerate(f.accepted_per_position):
            assert value("num_accepted_tokens_per_pos", tenant=tenant, position=str(pos)) == n
    assert len(traces["carol"].tokens) == 6
    assert not any(dict(labels).get("tenant") == "carol" for (n, labels) in got if "vllm" in n)
