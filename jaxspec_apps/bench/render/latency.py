"""The `latency` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec.decoding import analytic
from jaxspec_apps.bench.latency import MODES, crossover_ms, predicted_crossover_ms
from jaxspec_apps.bench.render.tables import Page, part


def table_md(comp: dict[str, float], rows: list[dict[str, Any]], gamma: int) -> str:
    """The components line, the RTT table (measured / predicted ms per token) and the
    crossover sentence, as markdown."""
    cross_m = crossover_ms(rows, "measured")
    cross_p = predicted_crossover_ms(comp, gamma)
    lines = [
        f"Measured components: t_ar = {comp['t_ar'] * 1e3:.2f} ms/token, t_d = "
        f"{comp['t_d'] * 1e3:.2f} ms/token, t_v = {comp['t_v'] * 1e3:.2f} ms/step, "
        f"alpha = {comp['alpha']:.3f}, gamma = {gamma}.",
        "",
        "| RTT ms | depth | " + " | ".join(f"{m} meas / pred ms" for m in MODES) + " |",
        "|---:|---:|" + "---:|" * len(MODES),
    ]
    for r in rows:
        cells = [f"{r['measured'][m] * 1e3:.2f} / {r['predicted'][m] * 1e3:.2f}" for m in MODES]
        lines.append(f"| {r['rtt_ms']} | {r['depth']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Pipelined stops beating co-located SD at RTT ≈ {cross_m} ms measured (first swept RTT "
        f"where it is slower), {cross_p:g} ms predicted.",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Any) -> None:
    """Time per token vs RTT: measured points, predicted lines, one colour per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [r["rtt_ms"] for r in rows]
    for m, color in zip(MODES, ("C0", "C1", "C2", "C3"), strict=True):
        ax.plot(x, [r["predicted"][m] * 1e3 for r in rows], "-", color=color, alpha=0.6)
        ax.plot(x, [r["measured"][m] * 1e3 for r in rows], "o", color=color, label=m)
    ax.set_xlabel("network round trip (ms)")
    ax.set_ylabel("time per token (ms)")
    ax.set_title("measured (points) vs predicted (lines)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def note(lat: dict[str, Any]) -> str:
    """Where pipelined beats sync and co-located decoding, measured."""
    rows = lat["rows"]

    def where(pred: Any) -> str:
        hits = [str(r["rtt_ms"]) for r in rows if pred(r["measured"])]
        return f"at RTT {', '.join(hits)} ms" if hits else "at no swept RTT"

    zero = [r for r in rows if r["rtt_ms"] == 0]
    extra = ""
    if zero:
        comp, g = lat["components"], lat["gamma"]
        e_a = analytic.expected_tokens(comp["alpha"], g)
        model = g * comp["t_d"] + comp["t_v"]
        gap = zero[0]["measured"]["sync"] * e_a - model
        extra = (
            f" At RTT 0 a sync round takes about {gap * 1e3:.1f} ms more than the model's "
            f"γ·t_d + t_v = {model * 1e3:.1f} ms: what an edge session pays per round besides "
            "drafting and the verify step (the drafter's rollback and append, the hop from "
            "asyncio into the verifier's thread, the scheduler's host-side work), which the "
            "model leaves out."
        )
    return (
        "Measured: pipelined beats sync edge-cloud decoding "
        + where(lambda m: m["pipelined"] < m["sync"])
        + "; it beats co-located speculative decoding "
        + where(lambda m: m["pipelined"] < m["colocated"])
        + ", and cloud autoregressive decoding "
        + where(lambda m: m["pipelined"] < m["cloud_ar"])
        + "."
        + extra
    )


def markdown_tiny(lat: dict[str, Any], page: Page) -> list[str]:
    """Section 4's RTT sweep (section 4's heading, which the batch sweep shares)."""
    return [
        "",
        "## 4. Latency vs RTT, and the verifier's batch sweep",
        *part(
            "### RTT sweep",
            f"Greedy, γ = {lat['gamma']}, {lat['new_tokens']} tokens, one prompt. The edge "
            "drafter and `verify.LocalVerifier` run in this process behind "
            "`edge.delayed.DelayedEndpoint` (RTT/2 each way); pipelined depth covers the "
            "round trip "
            "(capped at 8). Predictions: the papers' model (`jaxspec.decoding.analytic`, "
            "held equal to `proofs/latency.py`) at the measured t_d, t_v, α. Cloud AR and "
            "co-located decoding stream what the cloud computes, so their time per token is "
            "their compute time.",
            table_md(lat["components"], lat["rows"], lat["gamma"]).rstrip(),
            note(lat),
        ),
        *page.img("rtt", "time per token vs RTT"),
    ]


def markdown_real(lat: dict[str, Any], page: Page) -> list[str]:
    """The real pair's RTT sweep."""
    return part(
        "### RTT sweep",
        f"Greedy, γ = {lat['gamma']}, {lat['new_tokens']} tokens, one chat prompt, edge "
        "and verifier in this process behind `edge.DelayedEndpoint`.",
        table_md(lat["components"], lat["rows"], lat["gamma"]).rstrip(),
    )


def plot_section(lat: dict[str, Any], bench: Any) -> dict[str, str]:
    """`plot` of the sweep as bench/rtt.png."""
    plot(lat["rows"], bench / "rtt.png")
    return {"rtt": "bench/rtt.png"}
