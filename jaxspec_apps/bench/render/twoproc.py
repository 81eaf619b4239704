"""The `twoproc` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, stalls_table
from jaxspec_apps.bench.twoproc import KINDS


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "two processes" section of BENCHMARKS.md."""
    pinned = ("each pinned to its own core (verifier on core 0, edge on core 1)" if r["pinned"]
              else "unpinned (fewer than 2 cores were available)")  # fmt: skip
    lines = [
        "## Two processes: the edge and the verifier on their own cores",
        "",
        f"Produced by `{r['command']}`: `python -m verify serve` and the edge "
        f"(`jaxspec_apps.bench.twoproc_edge`) as two processes, {pinned}, one compute thread "
        f"each, over gRPC on loopback with a simulated round trip; gamma {r['gamma']}, "
        f"{r['new_tokens']} new tokens, T = 0, the best of the repeats. Measured on the edge's "
        f"core: t_d = {r['t_d'] * 1e3:.1f} ms per drafted token; the verifier's step after a "
        f"sync block: t_v = {r['t_v'] * 1e3:.1f} ms. Times are ms per token after the first "
        "round trip; predicted = the papers' model at those t_d, t_v, the measured acceptance "
        "and the papers' depth (blocks in flight while the next is drafted: the pipelined "
        "session runs one more, the block it drafts only once one is answered).",
        "",
        "Two cloud baselines, both the target on the verifier's core with one thread: **cloud "
        "streamed**, cloud decoding as its user gets it (`jaxspec_apps.bench.twoproc_cloud`: "
        "the target's plain decode loop, one round trip per request, then the tokens as they "
        "are made: the loop's time per token, prefill included, at every round trip), and "
        "**cloud gamma 0**, the verifier's own gamma-0 sessions, pipelined (8 empty blocks in "
        "flight, each answered with one token: a stream through the verifier); beside them "
        "the same sessions one block at a time (**gamma 0, a round trip per token**: what "
        "this table called cloud decoding before). edge / cloud = the pipelined edge user's "
        "tokens/s over each baseline's (`edge_over_cloud_ar` is the streamed loop's, "
        f"`edge_over_cloud_gamma0` the pipelined gamma-0 sessions'). The verifier's gamma-0 "
        "token costs "
        f"**{r['gamma0_over_decode']:.2f}x** the plain loop's at RTT 0 (`gamma0_over_decode`); "
        f"the worst pipelined / model is **{r['pipelined_vs_model']:.2f}** "
        "(`pipelined_vs_model`).",
        "",
        "| RTT ms | depth (session) | pipelined | predicted | sync | predicted | cloud streamed | "
        "cloud gamma 0 | gamma 0, a round trip per token | pipelined / model | "
        "edge / cloud streamed | edge / cloud gamma 0 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['rtt_ms']:g} | {x['depth']} ({x['session_depth']}) | "
            f"{x['pipelined'] * 1e3:.1f} | {x['predicted_pipelined'] * 1e3:.1f} | "
            f"{x['sync'] * 1e3:.1f} | {x['predicted_sync'] * 1e3:.1f} | "
            f"{x['cloud_streamed'] * 1e3:.1f} | {x['cloud_gamma0'] * 1e3:.1f} | "
            f"{x['cloud_gamma0_sync'] * 1e3:.1f} | "
            f"{x['pipelined_vs_model']:.2f} | {x['edge_over_cloud_ar']:.2f} | "
            f"{x['edge_over_cloud_gamma0']:.2f} |"
        )
    return [*lines, *stalls_md(r), *page.img("two_process", "two processes: time per token vs RTT")]


def stalls_md(r: dict[str, Any]) -> list[str]:
    """Where each edge session's time went (`SessionTrace.stalls`, the best run's), as
    shares of its wall time."""
    rows = (
        (f"| {x['rtt_ms']:g} | {KINDS[kind]} | ", x[f"{kind}_stalls"])
        for x in r["rows"]
        for kind in KINDS
    )
    return part(
        "Where the edge sessions' time went (each session's own trace, `SessionTrace.stalls`: "
        "waiting up to the verifier's step time, then beyond it: the round trip, gRPC, the "
        "answer's hop into the event loop):",
        stalls_table("| RTT ms | session | ", "|---:|---|", rows),
    )


def plot(r: dict[str, Any], bench: Any) -> dict[str, str]:
    """bench/two_process.png: measured and predicted time per token against the RTT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [row["rtt_ms"] for row in r["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("pipelined", "o-"), ("sync", "s-"), ("cloud_streamed", "^-"),
                       ("cloud_gamma0", "v-"), ("cloud_gamma0_sync", "x-")):  # fmt: skip
        ax.plot(x, [row[key] * 1e3 for row in r["rows"]], style, label=f"{key} (measured)")
    for key in ("pipelined", "sync"):
        ax.plot(x, [row[f"predicted_{key}"] * 1e3 for row in r["rows"]], "--",
                label=f"{key} (model)")  # fmt: skip
    ax.set_xlabel("round trip (ms)")
    ax.set_ylabel("ms per token")
    ax.legend()
    fig.tight_layout()
    fig.savefig(bench / "two_process.png", dpi=100)
    plt.close(fig)
    return {"two_process": "bench/two_process.png"}
