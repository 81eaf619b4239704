"""The `kernels` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.kernels import K, M
from jaxspec_apps.bench.render.tables import Page


def table_md(res: dict[str, Any]) -> list[str]:
    """The section's tables."""
    if "skipped" in res:
        return [f"Not run: {res['skipped']}."]
    lines = [
        f"The float kernel's {res['path']} path against XLA:CPU's own ops, timed in turns (best "
        f"of the run's repeats). Matmuls: a jitted chain of {res['chain']} weight matmuls of "
        f"{K} x {M} (GB/s of weight bytes read; 'NT' reads the weight as a stored [M, K] "
        "table, as the tied head does).",
        "",
        "| weights | layout | rows | kernel ms | XLA ms | kernel GB/s | XLA GB/s | XLA ÷ kernel |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["matmul"]:
        lines.append(
            f"| {r['dtype']} | {r['layout']} | {r['rows']} | {r['kernel_ms']:.1f} | "
            f"{r['xla_ms']:.1f} | {r['kernel_gb_s']:.1f} | {r['xla_gb_s']:.1f} | "
            f"{r['xla_ms'] / r['kernel_ms']:.2f}x |"
        )
    lines += [
        "",
        "The target's whole forward, kernels on (`Model.kernels`, the default on the CPU) and "
        "off (XLA's dot, reduce and softmax), one slot of 256 positions per row:",
        "",
        "| rows x positions | kernels ms | XLA ms | XLA ÷ kernels | ÷ a kernels decode step |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["model"]:
        lines.append(
            f"| {r['rows']} x {r['positions']} | {r['kernel_ms']:.1f} | {r['xla_ms']:.1f} | "
            f"{r['xla_over_kernel']:.2f}x | {r['over_kernel_decode']:.2f} |"
        )
    return lines


def markdown(res: dict[str, Any], page: Page) -> list[str]:
    """The kernels section of the real pair's report."""
    heading = "### The float kernel against XLA (batch-invariant matmul, attention)"
    return ["", heading, "", *table_md(res)]
