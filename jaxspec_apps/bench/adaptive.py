"""Adaptive gamma against every fixed gamma, over round trips and draft pairs.

Every point is pipelined edge-cloud decoding, batch 1, through an in-process verifier
(`verify.LocalVerifier` over one warmed-up scheduler) behind a simulated link
(`edge.DelayedEndpoint`, RTT/2 each way): the same prompts with each fixed gamma in
1..max_gamma and with `gamma="auto"` (`edge.adaptive.AdaptiveGamma`), at the same pipeline
depth. Time per token is the session's wall time over its tokens (the first round trip
included: the adaptive controller starts knowing nothing). The auto run's tokens must equal
every fixed run's token for token (position-keyed draws; pipelined mode has no bonus):
a difference is recorded as a failure.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from edge.adaptive import AdaptiveGamma
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from verify import LocalVerifier


async def _session(
    sched: Any,
    draft: Any,
    prompt: Sequence[int],
    gamma: int | str,
    max_gamma: int,
    depth: int,
    rtt_s: float,
    new_tokens: int,
) -> tuple[list[int], float, list[int]]:
    """(tokens, seconds per token, block lengths used) of one greedy pipelined session."""
    auto = gamma == "auto"
    spec = DraftSpec(gamma=max_gamma if auto else int(gamma), encoding="onehot", adaptive=auto)
    cfg = SessionConfig(
        prompt=tuple(prompt), max_new_tokens=new_tokens, mode="pipelined", draft=spec,
        sampling=SamplingSettings(temperature=0.0),
    )  # fmt: skip
    policy = AdaptiveGamma(max_gamma, "pipelined", depth) if auto else None
    v = LocalVerifier(scheduler=sched)
    try:
        tr = await run_session(
            DelayedEndpoint(v, one_way_s=rtt_s / 2),
            Drafter(draft, spec),
            cfg,
            depth=depth,
            block_len=policy,
        )
    finally:
        await v.aclose()
    used = policy.chosen if policy is not None else [int(gamma)] * tr.blocks_sent
    _alphas.append(tr.acceptance_rate)
    return tr.tokens, (tr.end_time - tr.start_time) / max(1, len(tr.tokens)), used


_alphas: list[float] = []  # acceptance (accepted / drafted) of every session, in order


def sweep(
    sched: Any,
    pairs: dict[str, Any],
    prompts: Sequence[Sequence[int]],
    *,
    rtts_ms: Sequence[float],
    max_gamma: int,
    new_tokens: int,
    depth_for: Any = None,
) -> dict[str, Any]:
    """`{"rows": [...], "failures": [...]}`: one row per (pair, RTT) with the mean time per
    token of each fixed gamma and of auto, the best fixed gamma, and auto's ratio to it."""
    depth_for = depth_for or (lambda rtt_s: max(2, min(4, math.ceil(rtt_s / 0.05) + 1)))
    rows, failures = [], []
    gammas: list[int | str] = [*range(1, max_gamma + 1), "auto"]
    for pair, draft in pairs.items():
        for rtt_ms in rtts_ms:
            rtt = rtt_ms / 1e3
            depth = depth_for(rtt)
            per: dict[str, float] = {}
            chosen: list[int] = []
            _alphas.clear()
            reference: dict[int, list[int]] = {}  # prompt -> tokens of the first gamma run
            for g in gammas:
                # One untimed session first: a block length's first session after other
                # lengths compiled again (measured: ~3 s here), which is not its speed.
                warm = (sched, draft, prompts[0], g, max_gamma, depth, rtt, new_tokens)
                asyncio.run(_session(*warm))
                times = []
                for i, prompt in enumerate(prompts):
                    toks, s, used = asyncio.run(
                        _session(sched, draft, prompt, g, max_gamma, depth, rtt, new_tokens)
                    )
                    times.append(s)
                    if g == "auto":
                        chosen += used
                    if reference.setdefault(i, toks) != toks:
                        failures.append(f"{pair} rtt={rtt_ms} ms prompt {i}: gamma {g} differs")
                per[str(g)] = sum(times) / len(times)
            fixed = {g: t for g, t in per.items() if g != "auto"}
            best = min(fixed, key=fixed.__getitem__)
            rows.append(
                {
                    "pair": pair,
                    "rtt_ms": rtt_ms,
                    "depth": depth,
                    "token_s": per,
                    "best_fixed_gamma": int(best),
                    "auto_over_best": per["auto"] / fixed[best],
                    "auto_gammas": {str(k): chosen.count(k) for k in sorted(set(chosen))},
                    "alpha": sum(_alphas) / len(_alphas),  # mean over this point's sessions
                }
            )
            print(
                f"{pair} rtt {rtt_ms:5.0f} ms depth {depth}: best fixed gamma {best} "
                f"{fixed[best] * 1e3:.2f} ms/token, auto {per['auto'] * 1e3:.2f} "
                f"({per['auto'] / fixed[best]:.3f}x), auto chose {rows[-1]['auto_gammas']}",
                flush=True,
            )
    return {"rows": rows, "failures": failures, "summary": summary(rows, max_gamma)}


def summary(rows: list[dict[str, Any]], max_gamma: int) -> dict[str, Any]:
    """Over the whole sweep: total time per token (sum over points) of auto and of each
    fixed gamma, and auto's worst ratio to the best fixed gamma at any one point."""
    total = {str(g): sum(r["token_s"][str(g)] for r in rows) for g in [*range(1, max_gamma + 1)]}
    auto = sum(r["token_s"]["auto"] for r in rows)
    best_single = min(total, key=total.__getitem__)
    return {
        "auto_total_s": auto,
        "fixed_total_s": total,
        "best_single_fixed_gamma": int(best_single),
        "auto_over_best_single": auto / total[best_single],
        "worst_point_ratio": max(r["auto_over_best"] for r in rows),
    }


def table_md(result: dict[str, Any], max_gamma: int) -> list[str]:
    head = " | ".join(f"γ={g}" for g in range(1, max_gamma + 1))
    lines = [
        f"| pair | α | RTT ms | depth | {head} | auto | best fixed | auto ÷ best | auto chose |",
        "|---|---|---|---|" + "---|" * max_gamma + "---|---|---|---|",
    ]
    for r in result["rows"]:
        t = r["token_s"]
        cells = " | ".join(f"{t[str(g)] * 1e3:.2f}" for g in range(1, max_gamma + 1))
        chose = ", ".join(f"{k}×{v}" for k, v in r["auto_gammas"].items())
        lines.append(
            f"| {r['pair']} | {r.get('alpha', float('nan')):.2f} | {r['rtt_ms']:.0f} | "
            f"{r['depth']} | {cells} | "
            f"**{t['auto'] * 1e3:.2f}** | γ={r['best_fixed_gamma']} | "
            f"{r['auto_over_best']:.3f} | {chose} |"
        )
    s = result["summary"]
    g = s["best_single_fixed_gamma"]
    lines += [
        "",
        f"Over the whole sweep (sum of ms/token over every point): auto "
        f"{s['auto_total_s'] * 1e3:.1f}; the best single fixed gamma (γ={g}) "
        f"{s['fixed_total_s'][str(g)] * 1e3:.1f} — auto ÷ best single fixed = "
        f"**{s['auto_over_best_single']:.3f}**; auto's worst point ÷ that point's best fixed "
        f"gamma = **{s['worst_point_ratio']:.3f}**.",
    ]
    return lines


def plot(result: dict[str, Any], max_gamma: int, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({r["pair"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 3.6), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        rs = [r for r in result["rows"] if r["pair"] == pair]
        x = [r["rtt_ms"] for r in rs]
        for g in range(1, max_gamma + 1):
            ax.plot(x, [r["token_s"][str(g)] * 1e3 for r in rs], color="0.7", lw=1)
        ax.plot(x, [min(r["token_s"][str(g)] for g in range(1, max_gamma + 1)) * 1e3 for r in rs],
                "k--", lw=1, label="best fixed γ at each RTT")  # fmt: skip
        ax.plot(x, [r["token_s"]["auto"] * 1e3 for r in rs], "C3o-", lw=2, label="γ = auto")
        ax.set_title(pair)
        ax.set_xlabel("round trip (ms)")
        ax.set_ylabel("ms per token")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
