"""The multi-tenant verifier: slot pool, verify step, scheduler, LocalVerifier."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.ckpts.tiny import tiny_config, to_dtype
from jaxspec.decoding.sampling import Purpose, SamplingParams, session_key, uniforms
from jaxspec.decoding.speculative import draft_q_for
from jaxspec.protocol import (
    GAMMA_CEILING,
    DraftBlock,
    DraftSpec,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SamplingSettings,
    SessionConfig,
)
from verify import LocalVerifier, Scheduler, SchedulerConfig
from verify.__main__ import build_parser, scheduler_config_from_args

CONFIG = SchedulerConfig(max_gamma=4, row_buckets=(1, 2, 4, 8), max_sessions=8, max_len=96)


def _models(dtype=jnp.float32):
    cfg = tiny_config()
    t = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
    d = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 7))
    t, d = (m.with_params(jax.tree.map(lambda a: a * 3, m.params)) for m in (t, d))
    return to_dtype(t, dtype), to_dtype(d, dtype)


class RefDrafter:
    """A cache-free drafter with the co-located loop's draws: the draft at position t is
    sampled with U(DRAFT, t) from the warped draft distribution given the prefix."""

    def __init__(self, draft: jaxspec.Model, config: SessionConfig):
        self.draft, self.c = draft, config
        self.params = SamplingParams.of([config.sampling])
        self.key = session_key(config.seed, 0)[None]

    def block(self, prefix: list[int], n: int):
        toks, qs, ids = [], [], []
        seq = list(prefix)
        for _ in range(n):
            T, W = len(seq), 64  # one padded shape: one compilation
            padded = np.zeros((1, W), np.int32)
            padded[0, :T] = seq
            logits, _ = self.draft(
                padded, np.arange(W)[None], self.draft.init_cache(1, W), np.arange(W)[None] < T
            )
            u = uniforms(self.key, jnp.asarray([[T]]), Purpose.DRAFT)[:, 0]
            d, q = draft_q_for(
                logits[:, T - 1], self.params, u, self.c.draft.encoding, self.c.draft.sparse_k
            )
            d = int(d[0])
            toks.append(d)
            seq.append(d)
            if self.c.draft.encoding == "full":
                qs.append(np.asarray(q[0], np.float64))
            elif self.c.draft.encoding == "sparse":
                ids.append(np.asarray(q[0][0]))
                qs.append(np.asarray(q[1][0], np.float64))
        if self.c.draft.encoding == "onehot":
            return tuple(toks), None, None
        return tuple(toks), np.stack(qs), (np.stack(ids) if ids else None)


def drive(sched: Scheduler, sid: str, drafter: RefDrafter, tenant="default") -> list[int]:
    """Run one sync/pipelined session to the end, one block per tick."""
    s = sched.sessions[sid]
    while not s.finished:
        toks, q, ids = drafter.block(s.tokens, s.config.draft.gamma)
        sched.submit(
            DraftBlock(
                session_id=sid, epoch=s.epoch, start=s.committed, tokens=toks, q=q, q_ids=ids
            ),
            tenant,
        )
        while s.queue:
            sched.tick()
    return s.tokens[s.prompt_len :]


SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingSettings))


def session_config(**kw) -> SessionConfig:
    """A `SessionConfig` from flat keywords (gamma, encoding, sparse_k go to its DraftSpec,
    the sampling fields to its SamplingSettings)."""
    spec = {k: kw.pop(k) for k in ("gamma", "encoding", "sparse_k") if k in kw}
    sampling = SamplingSettings(**{k: kw.pop(k) for k in SAMPLING if k in kw})
    return SessionConfig(**kw, sampling=sampling, draft=DraftSpec(**spec))


CONFIGS = [
    dict(mode="sync", encoding="full", temperature=1.0, seed=3),
    dict(mode="pipelined", encoding="sparse", sparse_k=4, temperature=0.8, top_p=0.9, seed=4),
    dict(mode="sync", encoding="onehot", temperature=0.0, seed=5),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_a_session_equals_colocated_speculative_generate(kw):
    """Verifier + drafter over the protocol == `generate(draft=...)` in one process, sampled
    too (float64: the same draws, the same decisions)."""
    with jax.enable_x64(True):
        t, d = _models(jnp.float64)
        cfg = session_config(prompt=(1, 2, 3, 4), max_new_tokens=14, gamma=3, **kw)
        sched = Scheduler(t, CONFIG)
        sid = sched.open(cfg).session_id
        got = drive(sched, sid, RefDrafter(d, cfg))
        ref = jaxspec.generate(
            t,
            list(cfg.prompt),
            cfg.max_new_tokens,
            draft=d,
            gamma=cfg.draft.gamma,
            mode=cfg.mode,
            encoding=cfg.draft.encoding,
            sparse_k=cfg.draft.sparse_k,
            sampling=cfg.sampling,
            seeds=[cfg.seed],
        )
        assert got == ref.tokens
        if cfg.sampling.temperature == 0.0:
            assert got == jaxspec.generate(t, list(cfg.prompt), 14, temperature=0.0).tokens


def test_many_sessions_batched_equal_each_alone():
    """Sessions verified together (mixed modes, encodings, gammas, prompts) produce what each
    produces alone: batch invariance, float64."""
    with jax.enable_x64(True):
        t, d = _models(jnp.float64)
        configs = [
            session_config(
                prompt=tuple(range(1, 2 + i * 3)),
                max_new_tokens=10,
                gamma=1 + i % 4,
                **CONFIGS[i % 3],
            )
            for i in range(5)
        ]
        alone = []
        for c in configs:
            sched = Scheduler(t, CONFIG)
            alone.append(drive(sched, sched.open(c).session_id, RefDrafter(d, c)))
        sched = Scheduler(t, CONFIG)
        sids = [sched.open(c).session_id for c in configs]
        drafters = [RefDrafter(d, c) for c in configs]
        sessions = [sched.sessions[s] for s in sids]
        while not all(s.finished for s in sessions):
            for s, dr in zip(sessions, drafters, strict=True):
                if not s.finished and not s.queue:
                    toks, q, ids = dr.block(s.tokens, s.config.draft.gamma)
                    sched.submit(
                        DraftBlock(
                            session_id=s.id,
                            epoch=s.epoch,
                            start=s.committed,
                            tokens=toks,
                            q=q,
                            q_ids=ids,
                        )
                    )
            sched.tick()
            assert sched.metrics.last_rows >= 1
        assert [s.tokens[s.prompt_len :] for s in sessions] == alone
        assert sched.metrics.mean_occupancy > 0.5


@pytest.fixture(scope="module")
def warm():
    t, _ = _models()
    sched = Scheduler(t, CONFIG)
    sched.warmup()
    return t, sched


def _greedy_block(sched, sid, plain, wrong_at=None):
    s = sched.sessions[sid]
    n = s.config.draft.gamma
    new = s.committed - s.prompt_len
    toks = list((plain + [0] * 10)[new : new + n])
    if wrong_at is not None and wrong_at < n:
        toks[wrong_at] = (toks[wrong_at] + 1) % 64
    return DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=tuple(toks))


def test_no_recompilation_after_warmup(warm):
    t, sched = warm
    before = (sched._step._cache_size(), sched._prefill._cache_size())
    rng = np.random.RandomState(0)
    sids, plains = [], []
    for i in range(6):
        prompt = tuple(rng.randint(0, 64, rng.randint(1, 30)).tolist())
        c = SessionConfig(
            prompt=prompt,
            max_new_tokens=12,
            sampling=SamplingSettings(top_k=i, temperature=[0.0, 0.7][i % 2]),
            mode=["sync", "pipelined"][i % 2],
            draft=DraftSpec(gamma=1 + i % 4, encoding="onehot"),
        )
        sids.append(sched.open(c, tenant=f"t{i % 3}").session_id)
        plains.append(jaxspec.generate(t, list(prompt), 12, temperature=0.0).tokens)
    for _ in range(30):
        for i, sid in enumerate(sids):
            s = sched.sessions.get(sid)
            if s is not None and not s.finished and not s.queue:
                sched.submit(_greedy_block(sched, sid, plains[i], rng.randint(0, 6)), f"t{i % 3}")
        sched.tick()
    assert (sched._step._cache_size(), sched._prefill._cache_size()) == before
    for i, sid in enumerate(sids):
        s = sched.sessions[sid]
        if s.config.sampling.temperature == 0.0:
            assert s.tokens[s.prompt_len :] == plains[i]
        sched.close(sid, f"t{i % 3}")
    assert sorted(sched.free_slots) == list(range(8))


def test_a_flooding_tenant_cannot_starve_another():
    t, _ = _models()
    config = SchedulerConfig(
        max_gamma=2, row_buckets=(1, 2), max_sessions=8, max_len=64, max_queue_per_session=8
    )
    sched = Scheduler(t, config)
    cfg = SessionConfig(
        prompt=(1, 2),
        max_new_tokens=40,
        sampling=SamplingSettings(temperature=0.0),
        draft=DraftSpec(gamma=2, encoding="onehot"),
    )
    flood = [sched.open(cfg, "flood").session_id for _ in range(6)]
    quiet = sched.open(cfg, "quiet").session_id
    while any(not s.ready_to_verify for s in sched.sessions.values()):
        sched.tick()  # prefill, two rows a tick
    served = []
    for _ in range(8):
        for sid in flood:
            s = sched.sessions[sid]
            if not s.queue:
                sched.submit(
                    DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=(0, 0)),
                    "flood",
                )
        q = sched.sessions[quiet]
        if not q.queue:
            sched.submit(
                DraftBlock(session_id=quiet, epoch=q.epoch, start=q.committed, tokens=(0, 0)),
                "quiet",
            )
        sched.tick()
        served.append(q.figures.rounds)
    # Two rows a tick, two tenants: the quiet tenant is served every tick.
    assert served == list(range(1, 9))


def test_errors_are_precise_and_harmless():
    t, _ = _models()
    clock = [0.0]
    config = SchedulerConfig(
        max_gamma=4,
        row_buckets=(1, 2),
        max_sessions=2,
        max_len=64,
        max_queue_per_session=2,
        idle_timeout_s=10,
    )
    sched = Scheduler(t, config, clock=lambda: clock[0])
    cfg = SessionConfig(
        prompt=(1, 2, 3), max_new_tokens=8, draft=DraftSpec(gamma=2, encoding="full")
    )
    a = sched.open(cfg, "A").session_id
    b = sched.open(cfg, "B").session_id
    with pytest.raises(ResourceExhausted):
        sched.open(cfg, "A")
    bad_cfgs = [
        dict(prompt=()),
        dict(prompt=(99,)),
        dict(gamma=5),
        dict(mode="x"),
        dict(encoding="x"),
        dict(temperature=-1.0),  # refused as the settings are made
        dict(logit_bias={64: 1.0}),  # outside the vocabulary: the scheduler's check at open
        dict(max_new_tokens=100),
        dict(seed=2**32),
    ]
    for kw in bad_cfgs:
        with pytest.raises(InvalidArgument):
            sched.open(session_config(**{**dict(prompt=(1,)), **kw}), "A")
    q = np.full((2, 64), 1 / 64)
    ok = DraftBlock(session_id=a, epoch=0, start=3, tokens=(5, 6), q=q)
    with pytest.raises(NotFound):  # B cannot see A's session: exactly like an unknown id
        sched.submit(ok, "B")
    with pytest.raises(NotFound):
        sched.submit(DraftBlock(session_id="f" * 32, epoch=0, start=3, tokens=(1,), q=q[:1]), "A")
    bad_blocks = [
        dict(tokens=()),
        dict(tokens=(1, 2, 3), q=np.full((3, 64), 1 / 64)),
        dict(q=q[:1]),
        dict(q=np.full((2, 64), 1 / 32)),
        dict(q=np.where(np.arange(64) == 5, 0, 1 / 63)[None].repeat(2, 0)),  # q(d) = 0
        dict(q=np.full((2, 64), np.nan)),
        dict(tokens=(5, 64)),
        dict(start=1),
    ]
    for kw in bad_blocks:
        with pytest.raises(InvalidArgument):
            sched.submit(DraftBlock(**{**ok.__dict__, **kw}), "A")
    with pytest.raises(FailedPrecondition):
        sched.submit(DraftBlock(**{**ok.__dict__, "epoch": 1}), "A")
    sched.submit(ok, "A")
    sched.submit(DraftBlock(**{**ok.__dict__, "start": 5}), "A")
    with pytest.raises(ResourceExhausted):
        sched.submit(ok, "A")
    first = dict(sched.tick())
    assert not first[1].stale and 2 not in first  # one block per session per tick
    second = dict(sched.tick())
    assert second[2].stale  # start 5 can never match: the first block committed 1 or 3
    # Nothing above touched session B.
    assert sched.sessions[b].tokens == [1, 2, 3] and sched.sessions[b].epoch == 0
    clock[0] = 100.0
    sched.tick()
    assert not sched.sessions and sorted(sched.free_slots) == [0, 1]
    with pytest.raises(NotFound):
        sched.submit(ok, "A")


def test_scheduler_config_is_validated_once_and_derives_its_buckets():
    c = SchedulerConfig(max_sessions=12, max_gamma=4)
    assert c.row_buckets == (1, 2, 4, 8, 12) and c.width_buckets == (1, 3, 5)
    assert c.token_budget == 12 * 5
    bad = [
        dict(max_gamma=0),
        dict(max_gamma=GAMMA_CEILING + 1),
        dict(max_sessions=0),
        dict(max_len=0),
        dict(idle_timeout_s=0.0),
        dict(max_sessions=4, row_buckets=(1, 8)),  # a row bucket larger than the pool
        dict(max_gamma=4, width_buckets=(3,)),  # no room for a full block
        dict(max_gamma=4, width_buckets=(3, 9)),  # a width no block can have
        dict(max_gamma=4, token_budget=4),  # no full block ever fits a step
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            SchedulerConfig(**kw)
    with pytest.raises(ValueError):
        LocalVerifier(_models()[0])  # a model needs its SchedulerConfig
    # `python -m verify serve` builds one config from its flags, rows over the data shards.
    flags = ["serve", "--max-sessions", "12", "--max-gamma", "3", "--mesh", "data=4,model=2"]
    c = scheduler_config_from_args(build_parser().parse_args(flags))
    assert (c.max_sessions, c.max_gamma, c.row_buckets) == (12, 3, (4, 8, 12))
    assert c.kv_buckets == (256, 512)  # the default slot: half and whole
    one = scheduler_config_from_args(build_parser().parse_args([*flags, "--kv-buckets", "512"]))
    assert one.kv_buckets == (512,)
    with pytest.raises(ValueError, match="kv buckets"):  # must end at --max-len
        scheduler_config_from_args(build_parser().parse_args([*flags, "--kv-buckets", "128"]))
    # Without scheduler flags: SchedulerConfig's own defaults (stated there only).
    assert scheduler_config_from_args(build_parser().parse_args(["serve"])) == SchedulerConfig()


def test_local_verifier_pipelined_blocks_in_flight():
    """Several blocks in flight per session, several sessions, one asyncio endpoint:
    greedy output equals plain greedy; a rejected block makes the next ones stale."""
    t, _ = _models()

    async def run():
        v = LocalVerifier(t, CONFIG)
        assert isinstance(v, jaxspec.protocol.VerifierEndpoint)
        prompts = [(1, 2, 3), (4, 5, 6, 7, 8)]
        plains = [jaxspec.generate(t, list(p), 16, temperature=0.0).tokens for p in prompts]

        async def session(prompt, plain, depth):
            cfg = SessionConfig(
                prompt=prompt,
                max_new_tokens=16,
                mode="pipelined",
                sampling=SamplingSettings(temperature=0.0),
                draft=DraftSpec(gamma=2, encoding="onehot"),
            )
            info = await v.open_session(cfg)
            out, epoch, stale = [], 0, 0
            while len(out) < 16:
                # Optimistic drafting: the plain continuation, wrong every 5th position.
                blocks = []
                for k in range(depth):
                    start = len(prompt) + len(out) + 2 * k
                    toks = tuple(
                        (plain + [0] * 20)[p - len(prompt)] + (p % 5 == 0)
                        for p in range(start, start + 2)
                    )
                    blocks.append(
                        DraftBlock(
                            session_id=info.session_id, epoch=epoch, start=start, tokens=toks
                        )
                    )
                results = await asyncio.gather(*(v.verify(b) for b in blocks))
                for r in results:
                    if r.stale:
                        stale += 1
                        continue
                    out += r.tokens
                    epoch = r.new_epoch
                    if r.finished:
                        break
            await v.close_session(info.session_id)
            return out, stale

        outs = await asyncio.gather(
            *(session(p, pl, 3) for p, pl in zip(prompts, plains, strict=True))
        )
        await v.aclose()
        return outs, plains

    outs, plains = asyncio.run(run())
    for (out, stale), plain in zip(outs, plains, strict=True):
        assert out == plain
        assert stale > 0


def test_the_event_loop_never_waits_for_a_step():
    """While a step holds the scheduler's lock (here: a thread holding it), `verify` and
    `open_session` leave the event loop free: another task runs meanwhile. The lock is
    released only once that task has run (or after 10 s, and the test fails); a refused
    block is still refused at once, before the lock is free."""
    t, _ = _models()

    async def run():
        v = LocalVerifier(t, CONFIG)
        cfg = session_config(prompt=(1, 2, 3), max_new_tokens=4, gamma=2)
        sid = (await v.open_session(cfg)).session_id
        loop_ran, held, freed = threading.Event(), threading.Event(), []

        def step():  # a long step: holds the lock until the loop shows it is free
            with v._lock:
                held.set()
                freed.append(loop_ran.wait(10))

        holder = threading.Thread(target=step)
        holder.start()
        held.wait(10)
        with pytest.raises(InvalidArgument):  # 3 drafts for gamma 2: refused at once
            await v.verify(DraftBlock(session_id=sid, epoch=0, start=3, tokens=(1, 2, 3),
                                      q=np.full((3, 64), 1 / 64)))  # fmt: skip
        block = DraftBlock(session_id=sid, epoch=0, start=3, tokens=())
        answers = [
            asyncio.ensure_future(v.verify(block)),
            asyncio.ensure_future(v.open_session(cfg)),
        ]
        await asyncio.sleep(0.05)  # the tasks ran up to their waits, the loop is here again
        loop_ran.set()
        holder.join()
        result, _ = await asyncio.gather(*answers)
        await v.aclose()
        return freed, result

    freed, result = asyncio.run(run())
    assert freed == [True], "the event loop waited for the lock"
    assert len(result.tokens) == 1 and not result.stale


_SHARDED = r"""
import json, sys, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, "tests")
import test_verifier as tv
import dataclasses
from verify import Scheduler, make_mesh
t, d = tv._models(jnp.float64)
mesh = make_mesh(int(sys.argv[1]), int(sys.argv[2])) if sys.argv[1] != "0" else None
config = dataclasses.replace(tv.CONFIG, row_buckets=(4, 8)) if mesh else tv.CONFIG  # 4 shards
sched = Scheduler(t, config, mesh=mesh)
outs = []
for i, kw in enumerate(tv.CONFIGS):
    c = tv.session_config(prompt=(1, 2, 3 + i), max_new_tokens=8, gamma=3, **kw)
    outs.append(tv.drive(sched, sched.open(c).session_id, tv.RefDrafter(d, c)))
print(json.dumps({"devices": len(jax.devices()), "outs": outs}))
"""


def test_sharded_over_8_devices_gives_the_same_tokens():
    """The same workload on 1 device and on a 4x2 ("data", "model") mesh of 8 forced CPU
    devices (a subprocess: the device count is fixed at JAX start-up)."""

    def run(data, model, devices):
        flags = (
            f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
        )
        env = dict(os.environ, XLA_FLAGS=flags)
        r = subprocess.run(
            [sys.executable, "-c", _SHARDED, str(data), str(model)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            cwd=os.path.dirname(os.path.dirname(__file__)),
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    one = run(0, 0, 1)
    eight = run(4, 2, 8)
    assert one["devices"] == 1 and eight["devices"] == 8
    assert eight["outs"] == one["outs"]
    assert all(len(o) == 8 for o in one["outs"])


def test_attending_over_a_kv_bucket_is_the_whole_slot_to_the_bit():
    """The step reads only the first A slot positions (A >= every live row's length): the
    same logits to the bit as attending over the whole slot, and the same cache."""
    t, _ = _models()
    rng = np.random.default_rng(3)
    cache = t.init_cache(2, 96)
    prompt = jnp.asarray(rng.integers(0, t.config.vocab_size, (2, 40)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
    _, cache = t(prompt, pos, cache)
    block = jnp.asarray(rng.integers(0, t.config.vocab_size, (2, 5)), jnp.int32)
    bpos = 40 + jnp.broadcast_to(jnp.arange(5), (2, 5))
    valid = jnp.ones((2, 5), bool)
    slots = jnp.array([1, 0])
    whole = t.module.apply({"params": t.params}, block, bpos, valid, cache, slots)
    part = t.module.apply({"params": t.params}, block, bpos, valid, cache, slots, 64)
    np.testing.assert_array_equal(np.asarray(part[0]), np.asarray(whole[0]))
    np.testing.assert_array_equal(np.asarray(part[1].k), np.asarray(whole[1].k))
    cut = t.module.apply({"params": t.params}, block, bpos, valid, cache, slots, 32)
    assert not np.array_equal(np.asarray(cut[0]), np.asarray(whole[0]))  # a bucket too short


def test_steps_read_the_kv_bucket_of_their_longest_row_and_count_the_padding():
    t, _ = _models()
    assert CONFIG.kv_buckets == (96,)  # short slots: one bucket by default
    sched = Scheduler(t, dataclasses.replace(CONFIG, kv_buckets=(64, 96)))
    cfg = SessionConfig(prompt=tuple(range(1, 11)), max_new_tokens=70,
                        sampling=SamplingSettings(temperature=0.0),
                        draft=DraftSpec(gamma=4, encoding="onehot"))  # fmt: skip
    sid = sched.open(cfg).session_id
    while not sched.sessions[sid].ready_to_verify:
        sched.tick()
    lengths = []
    while not sched.sessions[sid].finished:
        s = sched.sessions[sid]
        sched.submit(DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=(5, 6)))
        sched.tick()
        lengths.append((s.committed, sched.metrics.last_attended))
    assert {a for _, a in lengths} == {64, 96}  # short rows first, then the whole slot
    m = sched.metrics
    assert m.kv_read == sum(a for _, a in lengths) and 0 < m.kv_padding < 1
