"""The multi-tenant verify step: verified tokens/s vs batch size, against this machine's roofline.

For each batch size B (sessions verified in one step, each a block of gamma drafts), opens B
sessions on one `verify.Scheduler`, then times `tick()`s: verified positions per second
(B * (gamma + 1) / step time) as a ratio to B = 1, and the step time next to the roofline
bound measured in the same run: max((weight + KV bytes) / read bandwidth, FLOPs / matmul
FLOP/s), the KV bytes being the live positions (the step reads its KV bucket: `attended`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench import stepprofile
from verify import Scheduler, SchedulerConfig


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_roofline(mib: int = 256, n: int = 2048) -> dict[str, float]:
    """Read bandwidth (a jitted sum over `mib` MiB) and float32 matmul FLOP/s (n^3)."""

    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    t = min(_timed(lambda: total(x).block_until_ready()) for _ in range(5))
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, a).block_until_ready()
    tm = min(_timed(lambda: mm(a, a).block_until_ready()) for _ in range(3))
    return {"bandwidth_Bps": x.nbytes / t, "flops_per_s": 2 * n**3 / tm}


def step_flops(model: Any, rows: int, width: int, context: int) -> float:
    """Matmul FLOPs of one step: 2 * params per token, plus attention over the slot."""
    c = model.config
    attn = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context
    return rows * width * (2 * model.num_params() + attn)


def kv_bytes(model: Any, rows: int, slot_len: int) -> int:
    """Bytes of K and V one step reads: `rows` slots of `slot_len` positions in every layer
    (a padded step attends over the whole slot, masked)."""
    c = model.config
    item = np.dtype(model.dtype).itemsize
    return 2 * c.num_hidden_layers * rows * slot_len * c.num_key_value_heads * c.head_dim * item


def make_scheduler(
    model: Any,
    *,
    rows: Sequence[int],
    gamma: int,
    max_len: int,
    max_sparse_k: int = 16,
    warm: bool = True,
) -> Scheduler:
    """A `verify.Scheduler` with one row bucket per size in `rows` and one width bucket
    (gamma + 1), so every section of a run shares its compilations; warmed up (every shape
    compiled) unless `warm` is False (shapes then compile on first use)."""

    rows = tuple(sorted(set(rows)))
    config = SchedulerConfig(
        max_sessions=rows[-1],
        max_len=max_len,
        max_gamma=gamma,
        max_sparse_k=max_sparse_k,
        row_buckets=rows,
        width_buckets=(gamma + 1,),
    )
    sched = Scheduler(model, config)
    if warm:
        sched.warmup()
    return sched


PROFILE_STEPS = 2  # steps traced per profiled batch size (after one untraced)


def _profile(sched: Scheduler, step: Callable[[], None]) -> dict[str, Any]:
    """Where one step's time goes at the scheduler's last batch shape (`stepprofile`)."""
    m = sched.metrics
    batch = sched._build_batch([], [], m.last_bucket_rows, m.last_width, m.last_attended)
    hlo = sched._step.lower(sched.params, sched.cache, batch).compile().as_text()
    out = stepprofile.shares(lambda: (step(), jax.block_until_ready(sched.cache)), hlo,
                             steps=PROFILE_STEPS)  # fmt: skip
    return out | {"step_s": m.last_step_s}


def batch_sweep(
    model: Any,
    batches: Sequence[int],
    gamma: int,
    prompt_len: int,
    steps: int,
    *,
    scheduler: Any = None,
    roofline: dict[str, float] | None = None,
    profile_batches: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """`[{"roofline": ...}, row per batch size]`; each row has the step time (best of
    `steps` ticks of greedy one-hot blocks of random drafts), verified tokens/s, its ratio
    to batch 1, the roofline floor and the fraction of it achieved; batch sizes in
    `profile_batches` also get `profile` (where the step's time goes, `stepprofile.shares`,
    PROFILE_STEPS more steps). `scheduler` (from `make_scheduler`) must have a row bucket for
    every batch size."""

    sched = scheduler or make_scheduler(
        model,
        rows=batches,
        gamma=gamma,
        max_len=prompt_len + (steps + 3 + PROFILE_STEPS) * (gamma + 1) + gamma + 16,
    )
    roof = roofline or measure_roofline()
    rng = np.random.RandomState(0)
    rows = []
    for b in batches:
        cfg = SessionConfig(
            prompt=tuple(rng.randint(0, model.config.vocab_size, prompt_len)),
            max_new_tokens=(steps + 2 + PROFILE_STEPS + 1) * (gamma + 1) + 8,
            sampling=SamplingSettings(temperature=0.0),
            draft=DraftSpec(gamma=gamma, encoding="onehot"),
        )
        sids = [sched.open(cfg).session_id for _ in range(b)]
        while any(not sched.sessions[s].ready_to_verify for s in sids):
            sched.tick()

        def step(sids: list[str] = sids, b: int = b) -> None:
            for sid in sids:
                s = sched.sessions[sid]
                toks = tuple(rng.randint(0, model.config.vocab_size, gamma).tolist())
                sched.submit(
                    DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=toks)
                )
            sched.tick()
            assert sched.metrics.last_rows == b

        times = []
        for i in range(steps + 2):  # two untimed steps: the prefill finishes, caches warm
            step()
            if i >= 2:
                times.append(sched.metrics.last_step_s)
        profile = _profile(sched, step) if b in profile_batches else None
        for sid in sids:
            sched.close(sid)
        t = min(times)
        attended = sched.metrics.last_attended  # the step's KV bucket (positions per row)
        context = prompt_len + (steps + 2) * (gamma + 1) // 2  # mean slot length while timed
        kv = kv_bytes(model, b, context)  # live KV: what the roofline must read
        mem_s = (model.nbytes() + kv) / roof["bandwidth_Bps"]
        flop_s = step_flops(model, b, gamma + 1, context) / roof["flops_per_s"]
        rows.append(
            {
                "batch": b,
                "step_s": t,
                "verified_tok_s": b * (gamma + 1) / t,
                "roofline_s": max(mem_s, flop_s),
                "memory_floor_s": mem_s,
                "weight_bytes": model.nbytes(),
                "kv_bytes": kv,
                "kv_bytes_read": kv_bytes(model, b, attended),
                "attended": attended,
                "compute_floor_s": flop_s,
                **({"profile": profile} if profile else {}),
            }
        )
    base, roof1 = rows[0]["verified_tok_s"], rows[0]["roofline_s"]
    for r in rows:
        r["ratio_to_batch1"] = r["verified_tok_s"] / base
        r["roofline_fraction"] = r["roofline_s"] / r["step_s"]
        # The same ratio as the roofline predicts it: B rows per roofline_s(B).
        r["roofline_ratio_to_batch1"] = r["batch"] * roof1 / (rows[0]["batch"] * r["roofline_s"])
    return [{"roofline": roof}, *rows]
