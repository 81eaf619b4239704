"""The `cost` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page


def table_md(c: dict[str, Any], roof: dict[str, float] | None) -> list[str]:
    """One row per model timed, and what the figures are."""
    lines = [
        "| model | ms/token | tok/s | weight bytes | KV bytes/step | roofline ms | of roofline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = ["target", "draft"] + [k for k, v in c.items() if isinstance(v, dict) and k not in
                                    ("target", "draft")]  # fmt: skip
    for name in names:
        m = c[name]
        lines.append(
            f"| {name} | {m['s_per_token'] * 1e3:.2f} | {m['tok_s']:.1f} | "
            f"{m['weight_bytes']:,} | {m['kv_bytes_per_step']:,} | {m['roofline_s'] * 1e3:.2f} | "
            f"{m['roofline_fraction']:.0%} |"
        )
    bw = f" at {roof['bandwidth_Bps'] / 1e9:.1f} GB/s read bandwidth" if roof else ""
    lines += [
        "",
        f"Plain greedy decode loops, batch 1, {c['new_tokens']} tokens after a "
        f"{c['prompt_tokens']}-token chat prompt: (t(N) − t(8)) / (N − 8), so the prefill and "
        f"dispatch cancel out. Roofline: (weight + KV bytes one step reads) ÷ bandwidth{bw}. "
        f"Draft cost ratio c = **{c['draft_cost_ratio']:.3f}**. An int4 model runs its "
        f"matmuls of up to 16 rows on the int4 kernel (jaxspec/kernels, an XLA FFI custom call) "
        f'where it is built; its "XLA int4 path" row is the same model through XLA\'s unpack '
        f"and AQT's int dot.",
    ]
    return lines


def markdown(c: dict[str, Any], page: Page) -> list[str]:
    """The cost section of the real pair's report."""
    roof = page.sections.get("verifier", {}).get("roofline")
    return ["", "### Cost per token against the roofline", "", *table_md(c, roof)]
