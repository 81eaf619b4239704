"""The `adaptive` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page


def table_md(result: dict[str, Any], longest: int) -> list[str]:
    """One row per (pair, RTT), then the whole sweep's totals."""
    head = " | ".join(f"γ={g}" for g in range(1, longest + 1))
    alpha = any("alpha" in r for r in result["rows"])  # a sweep that measured each pair's α
    lines = [
        f"| pair | {'α | ' if alpha else ''}RTT ms | depth | {head} | auto | best fixed | "
        "auto ÷ best | auto chose |",
        "|---|" + "---|" * (alpha + 2 + longest) + "---|---|---|---|",
    ]
    for r in result["rows"]:
        t = r["token_s"]
        cells = " | ".join(f"{t[str(g)] * 1e3:.2f}" for g in range(1, longest + 1))
        chose = ", ".join(f"{k}×{v}" for k, v in r["auto_gammas"].items())
        lines.append(
            f"| {r['pair']} | "
            + (f"{r.get('alpha', float('nan')):.2f} | " if alpha else "")
            + f"{r['rtt_ms']:.0f} | "
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


def plot(result: dict[str, Any], longest: int, path: Any) -> None:
    """ms per token against the round trip, per pair: every fixed gamma, the best of them
    at each RTT, and auto."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({r["pair"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 3.6), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        rs = [r for r in result["rows"] if r["pair"] == pair]
        x = [r["rtt_ms"] for r in rs]
        for g in range(1, longest + 1):
            ax.plot(x, [r["token_s"][str(g)] * 1e3 for r in rs], color="0.7", lw=1)
        ax.plot(x, [min(r["token_s"][str(g)] for g in range(1, longest + 1)) * 1e3 for r in rs],
                "k--", lw=1, label="best fixed γ at each RTT")  # fmt: skip
        ax.plot(x, [r["token_s"]["auto"] * 1e3 for r in rs], "C3o-", lw=2, label="γ = auto")
        ax.set_title(pair)
        ax.set_xlabel("round trip (ms)")
        ax.set_ylabel("ms per token")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "Adaptive gamma" section of BENCHMARKS.md."""
    return [
        "## Adaptive gamma",
        "",
        f"Produced by `{r['command']}` on {r['cpus']} CPUs (load average "
        f"{r['load_average_1min_end']:.1f} at the end). Pipelined edge-cloud decoding, greedy, "
        f"batch 1, {r['prompts']} held-out prompts × {r['new_tokens']} tokens, through an "
        "in-process verifier behind a simulated link; ms per token (wall time over tokens, the "
        'first round trip included) for each fixed γ and for `gamma="auto"` (the edge picks '
        "each block's length from measured acceptance per position, draft time and answer "
        "latency by the papers' model, `edge.adaptive`). Every auto run's tokens equal the "
        "fixed runs' token for token"
        + (" (checked)." if not r["failures"] else f" — **NOT: {r['failures']}**."),
        "",
        *table_md(r, int(r["longest"])),
        "",
        "![ms per token vs round trip: every fixed gamma, the best of them, and auto]"
        "(bench/adaptive.png)",
    ]


def plot_section(r: dict[str, Any], bench: Any) -> dict[str, str]:
    """`plot` as bench/adaptive.png."""
    plot(r, int(r["longest"]), bench / "adaptive.png")
    return {"adaptive": "bench/adaptive.png"}
