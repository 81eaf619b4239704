"""The multi-tenant verify step: verified tokens/s vs batch size, against this machine's roofline.

For each batch size B (sessions verified in one step, each a block of gamma drafts), opens B
sessions on one `verify.Scheduler`, then times `tick()`s: verified positions per second
(B * (gamma + 1) / step time) as a ratio to B = 1, and the step time next to the roofline
bound measured in the same run: max((weight + KV bytes) / read bandwidth, FLOPs / matmul
FLOP/s), the KV bytes being the live positions (the step reads its KV bucket: `attended`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench import stepprofile
from jaxspec_apps.bench.common import make_scheduler
from jaxspec_apps.bench.section import Context, Section, sizes
from verify import Scheduler

# This section's sizes (the batch sweep: its batch sizes and timed steps).
Config = sizes("batch_", batches=(1, 2, 4, 8, 16, 32, 64), steps=10, flags={"batches": "batches"})


QUICK_SIZES = Config(batches=(1, 32), steps=2)
REAL_SIZES = Config(batches=(1, 4, 16), steps=4)


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


PROFILE_STEPS = 2  # steps traced per profiled batch size (after one untraced)


def _profile(sched: Scheduler, step: Callable[[], None]) -> dict[str, Any]:
    """Where one step's time goes at the scheduler's last batch shape (`stepprofile`)."""
    m = sched.metrics
    hlo = sched.step_hlo(m.last_bucket_rows, m.last_width, m.last_attended)
    out = stepprofile.shares(lambda: (step(), jax.block_until_ready(sched.cache)), hlo,
                             steps=PROFILE_STEPS)  # fmt: skip
    return out | {"step_s": m.last_step_s}


def _time_batch(
    sched: Scheduler, model: Any, b: int, gamma: int, prompt_len: int, steps: int,
    rng: np.random.RandomState, profile: bool,
) -> tuple[float, int, dict[str, Any] | None]:  # fmt: skip
    """(the best of `steps` step times, the KV bucket attended, the profile or None) of `b`
    sessions verified together, greedy one-hot blocks of random drafts."""
    cfg = SessionConfig(
        prompt=tuple(rng.randint(0, model.config.vocab_size, prompt_len)),
        max_new_tokens=(steps + 2 + PROFILE_STEPS + 1) * (gamma + 1) + 8,
        sampling=SamplingSettings(temperature=0.0),
        draft=DraftSpec(gamma=gamma, encoding="onehot"),
    )
    sids = [sched.open(cfg).session_id for _ in range(b)]
    while any(not sched.sessions[s].ready_to_verify for s in sids):
        sched.tick()

    def step() -> None:
        for sid in sids:
            s = sched.sessions[sid]
            toks = tuple(rng.randint(0, model.config.vocab_size, gamma).tolist())
            sched.submit(DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=toks))
        sched.tick()
        assert sched.metrics.last_rows == b

    times = []
    for i in range(steps + 2):  # two untimed steps: the prefill finishes, caches warm
        step()
        if i >= 2:
            times.append(sched.metrics.last_step_s)
    prof = _profile(sched, step) if profile else None
    for sid in sids:
        sched.close(sid)
    return min(times), sched.metrics.last_attended, prof


def _row(
    model: Any, b: int, gamma: int, context: int, t: float, attended: int,
    roof: dict[str, float],
) -> dict[str, Any]:  # fmt: skip
    """One batch size's row: the step time against the roofline floor of `b` rows of
    `context` live positions (`attended`: the KV bucket the step read)."""
    kv = kv_bytes(model, b, context)  # live KV: what the roofline must read
    mem_s = (model.nbytes() + kv) / roof["bandwidth_Bps"]
    flop_s = step_flops(model, b, gamma + 1, context) / roof["flops_per_s"]
    return {
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
    }


def batch_sweep(
    model: Any,
    batches: Sequence[int],
    gamma: int,
    prompt_len: int,
    steps: int,
    *,
    roofline: dict[str, float],
    scheduler: Any = None,
    profile_batches: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """One row per batch size: the step time (best of `steps` ticks of greedy one-hot
    blocks of random drafts), verified tokens/s, its ratio to batch 1, the `roofline` floor
    and the fraction of it achieved; batch sizes in `profile_batches` also get `profile`
    (where the step's time goes, `stepprofile.shares`, PROFILE_STEPS more steps).
    `scheduler` (from `make_scheduler`) must have a row bucket for every batch size."""
    sched = scheduler or make_scheduler(
        model,
        rows=batches,
        gamma=gamma,
        max_len=prompt_len + (steps + 3 + PROFILE_STEPS) * (gamma + 1) + gamma + 16,
    )
    rng = np.random.RandomState(0)
    context = prompt_len + (steps + 2) * (gamma + 1) // 2  # mean slot length while timed
    rows = []
    for b in batches:
        prof = b in profile_batches
        t, attended, profile = _time_batch(sched, model, b, gamma, prompt_len, steps, rng, prof)
        row = _row(model, b, gamma, context, t, attended, roofline)
        rows.append(row | ({"profile": profile} if profile else {}))
    base, roof1 = rows[0]["verified_tok_s"], rows[0]["roofline_s"]
    for r in rows:
        r["ratio_to_batch1"] = r["verified_tok_s"] / base
        r["roofline_fraction"] = r["roofline_s"] / r["step_s"]
        # The same ratio as the roofline predicts it: B rows per roofline_s(B).
        r["roofline_ratio_to_batch1"] = r["batch"] * roof1 / (rows[0]["batch"] * r["roofline_s"])
    return rows


def run_tiny(ctx: Context) -> dict[str, Any]:
    """The sweep over the profile's batch sizes on the shared verifier."""
    p = ctx.p
    roof = ctx.roof()
    rows = batch_sweep(
        ctx.target, p.verifier.batches, p.gamma, p.prompt_len, p.verifier.steps,
        scheduler=ctx.sched(),
        roofline=roof,
    )  # fmt: skip
    return {"gamma": p.gamma, "roofline": roof, "rows": rows}


def run_real(ctx: Context) -> dict[str, Any]:
    """The sweep with the first and last batch sizes profiled, and the slot length."""
    p = ctx.p
    rows = batch_sweep(
        ctx.target, p.verifier.batches, p.gamma, p.prompt_len, p.verifier.steps,
        scheduler=ctx.sched(),
        roofline=ctx.roof(), profile_batches=(p.verifier.batches[0], p.verifier.batches[-1]),
    )  # fmt: skip
    return {"gamma": p.gamma, "roofline": ctx.roof(), "rows": rows, "slot_len": ctx.max_len}


TINY = Section("verifier", run_tiny)
REAL = Section("verifier", run_real)
