"""The `target` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "Real target" section of BENCHMARKS.md."""
    gb = r["bandwidth_Bps"] / 1e9
    lines = [
        f"## Real target: {r['checkpoint']}, plain greedy decoding",
        "",
        f"Produced by `{r['command']}` on {r['machine']['cpus']} CPUs (load average "
        f"{r['machine']['load_average_1min']:.1f} at the end). `{r['checkpoint']}`: "
        f"{r['params']:,} parameters, float32 or bfloat16 as loaded. Batch 1, "
        f"{len(r['rows'])} {'chat' if r['chat'] else 'plain'} prompts, "
        f"{r['new_tokens']} new tokens each without a stop token; time per token is the "
        f"decode loop's alone (t(N) - t(8)) / (N - 8), best of {r['repeats']} after a "
        f"warm-up. Roofline: weight bytes ÷ {gb:.1f} GB/s read bandwidth "
        "measured in the same run (each step reads every weight once; the KV cache is not "
        "counted). Greedy tokens of jaxspec and transformers (float32 both): "
        + ("**identical** on every prompt." if not r["mismatches"] else "**DIFFER**: ")
        + "; ".join(r["mismatches"]),
        "",
        "| decoder | weights | ms/token | tok/s | roofline ms | fraction of roofline |",
        "|---|---|---|---|---|---|",
    ]
    for name, key, dtype in (
        ("jaxspec", "jaxspec_f32", "float32"),
        ("jaxspec", "jaxspec_bf16", "bfloat16"),
        ("transformers", "transformers_f32", "float32"),
    ):
        tps = r[f"{key}_tok_per_s"]
        roof = r.get(f"roofline_{dtype}_s", 0.0)
        frac = f"{roof * tps:.2f}"
        lines.append(
            f"| {name} | {dtype} | {1000 / tps:.1f} | {tps:.1f} | {roof * 1000:.1f} | {frac} |"
        )
    lines += [
        "",
        "jaxspec ÷ transformers (float32 tokens/s): "
        f"**{r['jaxspec_over_transformers_f32']:.2f}×**.",
        "",
        "| prompt | prompt tokens | identical | jaxspec f32 ms | jaxspec bf16 ms | "
        "transformers ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['prompt']} | {row['prompt_tokens']} | {row['identical_greedy_tokens']} | "
            f"{row['jaxspec_f32_s'] * 1000:.1f} | {row['jaxspec_bf16_s'] * 1000:.1f} | "
            f"{row['transformers_f32_s'] * 1000:.1f} |"
        )
    return lines
