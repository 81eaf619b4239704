"""Inter-token latency over a simulated WAN: cloud autoregressive, co-located speculative,
sync edge-cloud and pipelined edge-cloud decoding, measured next to the papers' model.

    python tools/bench_latency.py --out bench/latency          # the shipped default pair
    python tools/bench_latency.py --tiny --out /tmp/lat         # seconds (CI)

Everything runs in this process on this machine: the edge drafter (`edge.Drafter`), the
verifier (`verify.LocalVerifier`) behind `edge.DelayedEndpoint` (one-way delay RTT/2 each
way, FIFO). t_d (draft time per token), t_v (one verify step) and t_ar (one target decode
step) are measured first, alpha from co-located speculative decoding of the same prompt; the
predictions are `proofs.latency` evaluated at those numbers. Cloud autoregressive decoding
and co-located speculative decoding stream tokens the cloud computes, so their inter-token
latency is their measured compute time per token (the RTT delays only the first token).
Writes `<out>.md`, `<out>.json` and `<out>.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import pathlib
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # proofs/ (not installed)

import jaxspec
from edge.drafter import Drafter
from edge.session import DelayedEndpoint, run_session
from jaxspec.protocol import DraftBlock, SessionConfig
from jaxspec.sampling import SamplingParams, session_key
from proofs import latency
from verify import LocalVerifier, Scheduler

RTTS_MS = (0, 5, 20, 50, 100, 200)


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_components(target, draft, prompt, gamma, new_tokens, temperature, repeats):
    """t_ar, t_d, t_v (seconds) and co-located speculative time per token and alpha."""
    plain = _median_time(
        lambda: jaxspec.generate(target, prompt, new_tokens, temperature=temperature), repeats
    )
    spec_out = {}

    def spec():
        spec_out["o"] = jaxspec.generate(
            target, prompt, new_tokens, temperature=temperature, draft=draft, gamma=gamma
        )

    t_spec = _median_time(spec, repeats)
    o = spec_out["o"]
    drafter = Drafter(draft, gamma=gamma, encoding="onehot" if temperature == 0 else "full")
    state = drafter.prefill(drafter.init(1, len(prompt) + 8 * gamma), [prompt])
    params = SamplingParams.make(1, temperature)
    keys = session_key(0, 0)[None]

    def one_block():
        _, blk = drafter.draft(state, params, keys)
        jax.block_until_ready(blk.tokens)

    t_d = _median_time(one_block, repeats * 3) / gamma
    sched = Scheduler(
        target,
        max_sessions=1,
        max_len=len(prompt) + 4 * gamma + 16,
        max_gamma=gamma,
        row_buckets=(1,),
        width_buckets=(gamma + 1,),
    )
    sched.warmup()
    cfg = SessionConfig(
        prompt=tuple(prompt),
        max_new_tokens=gamma + 1,
        gamma=gamma,
        encoding="onehot",
        temperature=0.0,
    )
    times = []
    for _ in range(repeats * 3):
        sid = sched.open(cfg).session_id
        while not sched.sessions[sid].ready_to_verify:
            sched.tick()
        sched.submit(DraftBlock(session_id=sid, epoch=0, start=len(prompt), tokens=(0,) * gamma))
        sched.tick()
        times.append(sched.metrics.last_step_s)
        sched.close(sid)
    return {
        "t_ar": plain / new_tokens,
        "t_d": t_d,
        "t_v": statistics.median(times),
        "colocated_token_s": t_spec / o.stats.new_tokens,
        "alpha": o.stats.acceptance_rate,
    }


async def _edge(target_sched, draft, prompt, mode, gamma, depth, rtt_s, new_tokens, temperature):
    enc = "onehot" if temperature == 0 else "full"
    v = LocalVerifier(scheduler=target_sched)
    ep = DelayedEndpoint(v, one_way_s=rtt_s / 2)
    cfg = SessionConfig(
        prompt=tuple(prompt),
        max_new_tokens=new_tokens,
        gamma=gamma,
        mode=mode,
        encoding=enc,
        temperature=temperature,
    )
    try:
        tr = await run_session(ep, Drafter(draft, gamma=gamma, encoding=enc), cfg, depth=depth)
    finally:
        await v.aclose()
    return (tr.end_time - tr.start_time - rtt_s) / len(tr.tokens), tr.acceptance_rate


def run(target, draft, *, gamma, new_tokens, temperature, rtts_ms, repeats, prompt):
    comp = measure_components(target, draft, prompt, gamma, new_tokens, temperature, repeats)
    td, tv, a = comp["t_d"], comp["t_v"], comp["alpha"]
    sched = Scheduler(
        target,
        max_sessions=2,
        max_len=len(prompt) + new_tokens + 10 * gamma + 8,
        max_gamma=gamma,
        row_buckets=(1, 2),
        width_buckets=(gamma + 1,),
    )
    sched.warmup()
    rows = []
    for rtt_ms in rtts_ms:
        rtt = rtt_ms / 1e3
        depth = max(1, min(8, math.ceil((rtt + tv) / max(gamma * td, 1e-9))))
        meas = {}
        for mode, dep in (("sync", 1), ("pipelined", depth)):
            for _ in range(2):  # the first run compiles the drafter for this shape
                meas[mode], _ = asyncio.run(
                    _edge(sched, draft, prompt, mode, gamma, dep, rtt, new_tokens, temperature)
                )
        rows.append(
            {
                "rtt_ms": rtt_ms,
                "depth": depth,
                "measured": {
                    "cloud_ar": comp["t_ar"],
                    "colocated": comp["colocated_token_s"],
                    "sync": meas["sync"],
                    "pipelined": meas["pipelined"],
                },
                "predicted": {
                    "cloud_ar": comp["t_ar"],
                    "colocated": latency.colocated_token_time(gamma, a, td, tv),
                    "sync": latency.sync_token_time(gamma, a, td, rtt, tv),
                    "pipelined": latency.pipelined_expected_token_time(
                        gamma, a, td, rtt, tv, depth
                    ),
                },
            }
        )
    return comp, rows


def crossover_ms(rows: list[dict[str, Any]], key: str) -> float | None:
    """The first RTT at which pipelined is slower per token than co-located SD."""
    for r in rows:
        if r[key]["pipelined"] > r[key]["colocated"]:
            return r["rtt_ms"]
    return None


def predicted_crossover_ms(comp: dict[str, float], gamma: int, max_ms: int = 1000) -> float:
    td, tv, a = comp["t_d"], comp["t_v"], comp["alpha"]
    co = latency.colocated_token_time(gamma, a, td, tv)
    for ms in np.arange(0, max_ms, 0.5):
        rtt = ms / 1e3
        depth = max(1, min(8, math.ceil((rtt + tv) / max(gamma * td, 1e-9))))
        if latency.pipelined_expected_token_time(gamma, a, td, rtt, tv, depth) > co:
            return float(ms)
    return float("inf")


def write_report(out: pathlib.Path, comp, rows, gamma: int, argv: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    cross_m = crossover_ms(rows, "measured")
    cross_p = predicted_crossover_ms(comp, gamma)
    modes = ("cloud_ar", "colocated", "sync", "pipelined")
    lines = [
        f"Measured components: t_ar = {comp['t_ar'] * 1e3:.2f} ms/token, t_d = "
        f"{comp['t_d'] * 1e3:.2f} ms/token, t_v = {comp['t_v'] * 1e3:.2f} ms/step, "
        f"alpha = {comp['alpha']:.3f}, gamma = {gamma}.",
        "",
        "| RTT ms | depth | " + " | ".join(f"{m} meas / pred ms" for m in modes) + " |",
        "|---:|---:|" + "---:|" * len(modes),
    ]
    for r in rows:
        cells = [f"{r['measured'][m] * 1e3:.2f} / {r['predicted'][m] * 1e3:.2f}" for m in modes]
        lines.append(f"| {r['rtt_ms']} | {r['depth']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Pipelined stops beating co-located SD at RTT ≈ {cross_m} ms measured (first swept RTT "
        f"where it is slower), {cross_p:g} ms predicted.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "argv": argv,
                "components": comp,
                "rows": rows,
                "crossover_ms_measured": cross_m,
                "crossover_ms_predicted": cross_p,
            },
            indent=2,
        )
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [r["rtt_ms"] for r in rows]
    for m, color in zip(modes, ("C0", "C1", "C2", "C3"), strict=True):
        ax.plot(x, [r["predicted"][m] * 1e3 for r in rows], "-", color=color, alpha=0.6)
        ax.plot(x, [r["measured"][m] * 1e3 for r in rows], "o", color=color, label=m)
    ax.set_xlabel("network round trip (ms)")
    ax.set_ylabel("time per token (ms)")
    ax.set_title("measured (points) vs predicted (lines)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--draft", default="default-draft")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--rtts", default=",".join(map(str, RTTS_MS)))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/latency")
    a = p.parse_args(argv)
    if a.tiny:
        from jaxspec.testing import tiny_config

        cfg = tiny_config()
        target = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        draft = target.with_params(jax.tree.map(lambda x: x * 1.02, target.params))
        prompt = [1, 2, 3, 4]
        a.new_tokens, a.repeats, a.rtts = 8, 1, "0,20"
    else:
        target, draft = jaxspec.load(a.target), jaxspec.load(a.draft)
        import inspect
        import json as json_mod

        text = inspect.getsource(json_mod)
        prompt = target.tokenizer.encode(text[:400], add_special_tokens=False)[:48]
    comp, rows = run(
        target,
        draft,
        gamma=a.gamma,
        new_tokens=a.new_tokens,
        temperature=a.temperature,
        rtts_ms=[int(r) for r in a.rtts.split(",")],
        repeats=a.repeats,
        prompt=prompt,
    )
    out = pathlib.Path(a.out)
    write_report(out, comp, rows, a.gamma, sys.argv[1:] if argv is None else argv)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
