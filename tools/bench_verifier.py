"""Multi-tenant verify step: verified tokens/s vs batch size, against this machine's roofline.

    python tools/bench_verifier.py --checkpoint default          # the shipped target
    python tools/bench_verifier.py --tiny                        # seconds (CI)

For each batch size B (sessions verified in one step, each a block of gamma drafts), opens B
sessions on one `Scheduler`, warms the step up, then times `tick()`s. Prints verified
positions per second (B * (gamma + 1) / step time) as a ratio to B = 1, and the step time
next to the roofline bound measured in the same run: max(weight bytes / measured read
bandwidth, FLOPs / measured matmul throughput).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.protocol import DraftBlock, SessionConfig
from verify import Scheduler


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


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_flops(model: jaxspec.Model, rows: int, width: int, context: int) -> float:
    """Matmul FLOPs of one step: 2 * params per token, plus attention over the slot."""
    c = model.config
    attn = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context
    return rows * width * (2 * model.num_params() + attn)


def bench(
    model: jaxspec.Model, batches: list[int], gamma: int, prompt_len: int, steps: int
) -> list[dict[str, Any]]:
    sched = Scheduler(
        model,
        max_sessions=max(batches),
        max_len=prompt_len + steps * (gamma + 1) + gamma + 16,
        max_gamma=gamma,
        row_buckets=tuple(batches),
        width_buckets=(gamma + 1,),
    )
    sched.warmup()
    roof = measure_roofline()
    rng = np.random.RandomState(0)
    rows = []
    for b in batches:
        cfg = SessionConfig(
            prompt=tuple(rng.randint(0, model.config.vocab_size, prompt_len)),
            max_new_tokens=steps * (gamma + 1) + 8,
            gamma=gamma,
            encoding="onehot",
            temperature=0.0,
        )
        sids = [sched.open(cfg).session_id for _ in range(b)]
        while any(not sched.sessions[s].ready_to_verify for s in sids):
            sched.tick()
        times = []
        for _ in range(steps):
            for sid in sids:
                s = sched.sessions[sid]
                toks = tuple(rng.randint(0, model.config.vocab_size, gamma).tolist())
                sched.submit(
                    DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=toks)
                )
            sched.tick()
            assert sched.metrics.last_rows == b
            times.append(sched.metrics.last_step_s)
        for sid in sids:
            sched.close(sid)
        t = statistics.median(times)
        mem_s = model.nbytes() / roof["bandwidth_Bps"]
        flop_s = step_flops(model, b, gamma + 1, prompt_len + steps) / roof["flops_per_s"]
        rows.append(
            {
                "batch": b,
                "step_s": t,
                "verified_tok_s": b * (gamma + 1) / t,
                "roofline_s": max(mem_s, flop_s),
                "memory_floor_s": mem_s,
                "compute_floor_s": flop_s,
            }
        )
    base = rows[0]["verified_tok_s"]
    for r in rows:
        r["ratio_to_batch1"] = r["verified_tok_s"] / base
        r["roofline_fraction"] = r["roofline_s"] / r["step_s"]
    return [{"roofline": roof}, *rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="default")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batches", default="1,2,4,8,16,32,64")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.tiny:
        from jaxspec.testing import tiny_config

        cfg = tiny_config()
        model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        a.batches, a.steps, a.prompt_len = "1,2,4", 2, 8
    else:
        model = jaxspec.load(a.checkpoint)
    out = bench(model, [int(b) for b in a.batches.split(",")], a.gamma, a.prompt_len, a.steps)
    roof, rows = out[0]["roofline"], out[1:]
    print(
        f"machine: read bandwidth {roof['bandwidth_Bps'] / 1e9:.1f} GB/s, "
        f"matmul {roof['flops_per_s'] / 1e9:.0f} GFLOP/s; model {model.num_params():,} params, "
        f"{model.nbytes() / 1e6:.1f} MB; gamma {a.gamma}"
    )
    print(
        f"{'batch':>5} {'step ms':>8} {'verified tok/s':>14} {'vs batch 1':>10} "
        f"{'roofline ms':>11} {'of roofline':>11}"
    )
    for r in rows:
        print(
            f"{r['batch']:>5} {r['step_s'] * 1e3:>8.2f} {r['verified_tok_s']:>14.0f} "
            f"{r['ratio_to_batch1']:>9.2f}x {r['roofline_s'] * 1e3:>11.2f} "
            f"{r['roofline_fraction']:>10.0%}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "results": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
