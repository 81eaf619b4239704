"""The `colocated` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, ratio, save, table


def table_md(c: dict[str, Any]) -> list[str]:
    """The tiny pair's table: one row per (draft, temperature, gamma, mode)."""
    pairs = (("draft", "default_pair"), ("W4A16 target (self)", "self_w4a16"))
    return table(
        "| draft | temp | γ | mode | plain tok/s | spec tok/s | speedup | α | tokens/round |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
        (
            f"| {label} | {x['temperature']:g} | {x['gamma']} | {x['mode']} | "
            f"{x['plain_tok_s']:.0f} | {x['spec_tok_s']:.0f} | {ratio(x['speedup'])} | "
            f"{x['alpha']:.3f} | {x['tokens_per_round']:.2f} |"
            for label, key in pairs
            for x in c[key]
        ),
    )


def markdown_tiny(c: dict[str, Any], page: Page) -> list[str]:
    """Section 1 of the tiny pair's report."""
    p = page.settings
    return [
        *part(
            "## 1. Co-located speculative vs plain decoding",
            f"Batch 1, {p['prompts']} prompt(s) one at a time, {p['new_tokens']} new tokens "
            "each, no stop token; plain and speculative timed in the same run (best of "
            f"{p['repeats']} after a warm-up). Greedy outputs are asserted identical to plain "
            "decoding. α = accepted / drafted (vLLM's definition). Self-speculation drafts with "
            f"the target itself at W4A16, group 128 ({c['self_draft_bytes']:,} bytes resident).",
            table_md(c),
        ),
        *page.img("colocated", "co-located speedup"),
    ]


def plot(c: dict[str, Any], bench: Any) -> dict[str, str]:
    """Speedup per configuration, the draft's bars and self-speculation's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    rows = [("pair", x) for x in c["default_pair"]] + [("self", x) for x in c["self_w4a16"]]
    labels = [f"T={x['temperature']:g}\nγ{x['gamma']}\n{x['mode'][:4]}" for _, x in rows]
    colors = ["C0" if k == "pair" else "C1" for k, _ in rows]
    ax.bar(range(len(rows)), [x["speedup"] for _, x in rows], color=colors)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("speculative ÷ plain tokens/s")
    ax.set_title("co-located speculative decoding (blue: draft model, orange: self W4A16)")
    return save(fig, bench, "colocated")


def markdown_real(c: dict[str, Any], page: Page) -> list[str]:
    """One sentence per row of the real pair's run."""
    temps = ", ".join(f"{row['temperature']:g}" for row in c["rows"])
    lines = ["", f"### Co-located at T = {temps}", ""]
    for row in c["rows"]:
        lines.append(
            f"T = {row['temperature']:g}, γ = {_gamma(row)}, {row['mode']}, "
            f"{row['prompts']} prompts (one per category): plain {row['plain_tok_s']:.1f} "
            f"tok/s, speculative {row['spec_tok_s']:.1f} tok/s, **{ratio(row['speedup'])}**, "
            f"α {row['alpha']:.3f}, {row['tokens_per_round']:.2f} tokens per round."
        )
    return lines


def _gamma(row: dict[str, Any]) -> str:
    """A row's gamma; for gamma="auto" with what it picked."""
    if row["gamma"] != "auto":
        return str(row["gamma"])
    return f"auto (picked {', '.join(str(g) for g in sorted(set(row.get('gammas', []))))})"
