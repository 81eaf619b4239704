"""The `quality` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, columns, part


def table_md(q: dict[str, Any]) -> list[str]:
    """The tiny pair's table: the draft unquantized and at W4A16."""
    return columns("quality_table", ({"label": k, **x} for k, x in q["rows"].items()))


def markdown_tiny(q: dict[str, Any], page: Page) -> list[str]:
    """The tiny pair's W4A16 section."""
    return part(
        "## W4A16 draft quality",
        f"The draft unquantized (float32 as loaded) and at W4A16 (group 128): "
        f"perplexity on {q['windows']} windows of {q['seq_len']} held-out tokens, greedy "
        "agreement with the target there, α of co-located decoding (γ = 4) on "
        f"{q['prompts']} held-out prompts × {q['new_tokens']} tokens. Ratios W4A16 ÷ "
        f"unquantized: bytes (vs bf16) **{q['w4a16_bytes_ratio']:.3f}**, perplexity "
        f"**{q['w4a16_ppl_ratio']:.3f}**, α at T=1 **{q['w4a16_alpha_ratio']:.3f}** "
        f"(T=0: {q['w4a16_alpha_ratio_t0']:.3f}). `tools/quality_w4a16.py` has the full "
        "variant table.",
        table_md(q),
    )


def real_md(q: dict[str, Any]) -> list[str]:
    """The real pair's table: the target and each draft."""
    lines = [
        f"Held-out perplexity on {q['windows']} windows of {q['seq_len']} tokens of the "
        "stdlib documents the pairs never trained on, teacher-forced greedy agreement with the "
        f"target there, and α of co-located decoding (γ = {q['gamma']}) on {q['prompts']} "
        f"prompts × {q['new_tokens']} tokens.",
        "",
        "| model | params | resident bytes | × target bf16 | held-out ppl | greedy agreement | "
        "α T=0 | α T=0.7 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in q["rows"].items():
        a0 = f"{r['alpha_t0']:.3f}" if "alpha_t0" in r else "—"
        a1 = f"{r['alpha_t0.7']:.3f}" if "alpha_t0.7" in r else "—"
        lines.append(
            f"| {label} | {r['params']:,} | {r['resident_bytes']:,} | "
            f"{r['bytes_vs_target_bf16']:.3f} | {r['ppl']:.2f} | {r['greedy_agreement']:.3f} | "
            f"{a0} | {a1} |"
        )
    return lines


def markdown_real(q: dict[str, Any], page: Page) -> list[str]:
    """The real pair's W4A16 section."""
    return part("### W4A16 on this model: self-speculation and the shipped draft", real_md(q))
