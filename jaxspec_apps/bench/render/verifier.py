"""The `verifier` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, ratio, save, table


def table_md(v: dict[str, Any]) -> list[str]:
    """The machine's roofline and the sweep's table."""
    roof = v["roofline"]
    return [
        f"Machine roofline, measured in this run: read bandwidth "
        f"{roof['bandwidth_Bps'] / 1e9:.1f} GB/s, float32 matmul "
        f"{roof['flops_per_s'] / 1e9:.0f} GFLOP/s (ridge "
        f"{roof['flops_per_s'] / roof['bandwidth_Bps']:.1f} FLOP/byte); γ = {v['gamma']}.",
        "",
        *table(
            "| batch | step ms | verified tok/s | vs batch 1 | roofline predicts | roofline ms | "
            "of roofline |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            (
                f"| {x['batch']} | {x['step_s'] * 1e3:.2f} | {x['verified_tok_s']:.0f} | "
                f"{ratio(x['ratio_to_batch1'])} | {ratio(x['roofline_ratio_to_batch1'])} | "
                f"{x['roofline_s'] * 1e3:.2f} | {x['roofline_fraction']:.0%} |"
                for x in v["rows"]
            ),
        ),
    ]


def note(rows: list[dict[str, Any]]) -> str:
    """What the batch sweep says against the bound, in words chosen by the numbers."""
    one, top = rows[0], max(rows, key=lambda x: x["ratio_to_batch1"])
    if top["ratio_to_batch1"] > top["roofline_ratio_to_batch1"]:
        return (
            f"Batching scales past the bound's ratio ({ratio(top['ratio_to_batch1'])} at "
            f"{top['batch']} rows vs {ratio(top['roofline_ratio_to_batch1'])}) because one row is "
            f"far from the bound ({one['roofline_fraction']:.0%} of it: per-op and host "
            "overheads dominate), and rows share those overheads; the achieved fraction rises "
            f"to {top['roofline_fraction']:.0%}. The roofline ratio is small because this CPU "
            "turns compute-bound after a few rows (its ridge point is a few FLOP/byte)."
        )
    return (
        f"Batching gains {ratio(top['ratio_to_batch1'])} at {top['batch']} rows, below the "
        f"{ratio(top['roofline_ratio_to_batch1'])} the bound allows."
    )


def markdown_tiny(v: dict[str, Any], page: Page) -> list[str]:
    """Section 4's batch sweep (with section 4's heading when the RTT sweep did not run)."""
    heading = [] if "latency" in page.sections else [
        "", "## 4. Latency vs RTT, and the verifier's batch sweep"
    ]  # fmt: skip
    return [
        *heading,
        *part(
            "### Batch sweep of the verify step",
            "B sessions verified in one step (random one-hot blocks); the roofline bound is "
            "max(weight bytes ÷ read bandwidth, FLOPs ÷ matmul throughput), and "
            "*roofline predicts* is the tokens/s ratio to batch 1 that bound allows.",
            table_md(v),
            note(v["rows"]),
        ),
        *page.img("batch", "batch sweep"),
    ]


def markdown_real(v: dict[str, Any], page: Page) -> list[str]:
    """The real pair's sweep, with the step's profile."""
    return [
        *part(
            "### Verifier batch sweep (weights + live KV bytes in the roofline)",
            f"Slot length {v['slot_len']}; the step reads its KV bucket "
            f"({', '.join(str(r['attended']) for r in v['rows'])} positions a row, by batch), "
            "the roofline counts the live positions only.",
            table_md(v),
        ),
        *profile_md(v["rows"]),
    ]


def profile_md(rows: list[dict[str, Any]]) -> list[str]:
    """Where the step's time goes (jax.profiler, `jaxspec_apps.bench.stepprofile`)."""
    prof = [r for r in rows if "profile" in r]
    if not prof:
        return []
    cats = ("weight matmuls", "logits", "attention", "rule", "other")
    lines = [
        "",
        "Where the step's time goes (one `jax.profiler` trace of two steps, XLA op time by "
        "source op; `jaxspec_apps/bench/stepprofile.py`):",
        "",
        "| batch | " + " | ".join(cats) + " | op ms per step | step ms |",
        "|---:|" + "---:|" * (len(cats) + 2),
    ]
    for r in prof:
        f = r["profile"]["fractions"]
        lines.append(
            f"| {r['batch']} | " + " | ".join(f"{f.get(c, 0.0):.0%}" for c in cats)
            + f" | {r['profile']['op_seconds'] * 1e3:.1f} | {r['step_s'] * 1e3:.1f} |"
        )  # fmt: skip
    one = prof[0]
    mm = sum(one["profile"]["fractions"].get(c, 0.0) for c in ("weight matmuls", "logits"))
    lines += [
        "",
        f"At batch {one['batch']} {mm:.0%} of the op time is the weight matmuls and the tied "
        "logits (on the CPU the float kernel's custom calls, `jaxspec.kernels`): the step "
        "reads every weight once, as the roofline assumes, so its gap to the roofline "
        f"({one['roofline_fraction']:.0%} of it) is mostly the gap between those matmuls at a "
        "few rows and the bandwidth `jnp.sum` reaches over one buffer. At larger "
        "batches the step turns compute-bound on this CPU (its ridge point is a few FLOP per "
        "byte), and the share of attention and the rule grows with the rows.",
    ]
    return lines


def plot(v: dict[str, Any], bench: Any) -> dict[str, str]:
    """Verified tokens/s against batch 1, measured and as the roofline allows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = v["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    b = [x["batch"] for x in rows]
    ax.plot(b, [x["ratio_to_batch1"] for x in rows], "o", label="measured")
    ax.plot(b, [x["roofline_ratio_to_batch1"] for x in rows], "-", label="roofline bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sessions per verify step")
    ax.set_ylabel("verified tokens/s ÷ batch 1")
    ax.legend()
    return save(fig, bench, "batch")
