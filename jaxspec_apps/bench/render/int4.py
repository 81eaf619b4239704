"""The `int4` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.int4 import HIDDEN, LAYERS, VOCAB
from jaxspec_apps.bench.render.tables import Page


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "int4 kernel" section of BENCHMARKS.md."""
    lines = [
        "## The int4 kernel against XLA's paths (SmolLM2-shaped decode stack)",
        "",
        f"Produced by `{r['command']}`: {LAYERS} layers of SmolLM2-135M's matmul shapes and "
        f"the tied head ({HIDDEN} -> {VOCAB}), random weights, group {r['group']}, "
        f"{'with a' if r['offset'] else 'no'} per-group offset; the four variants timed "
        f"alternating, the median of {r['repeats']} after a warm-up. Of roofline = weight "
        f"bytes read ÷ time ÷ {r['bandwidth_Bps'] / 1e9:.1f} GB/s read bandwidth measured in "
        f"the same run. Kernel: {r['status']}.",
        "",
        "| rows | variant | weight MB read per step | ms/step | of roofline |",
        "|---:|---|---:|---:|---:|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['rows']} | {x['variant']} | {r['weight_bytes'][x['variant']] / 1e6:.1f} | "
            f"{x['ms']:.2f} | {x['roofline_fraction']:.2f} |"
        )
    return lines
