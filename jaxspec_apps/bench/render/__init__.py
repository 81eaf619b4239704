"""The report of `jaxspec bench`, written from the measured JSON alone: one template per
section (its part of BENCHMARKS.md and its plot), the pages that put them in order, and the
files (`render_report` re-renders BENCHMARKS.md and bench/*.md without measuring)."""

from jaxspec_apps.bench.render.files import (
    draw_kept_plot,
    draw_plots,
    kept_md,
    plot_paths,
    render_report,
    splice_section,
    write_kept,
    write_results,
)
from jaxspec_apps.bench.render.page import report, writer
from jaxspec_apps.bench.render.templates import KEPT_ORDER

__all__ = [
    "KEPT_ORDER",
    "draw_kept_plot",
    "draw_plots",
    "kept_md",
    "plot_paths",
    "render_report",
    "report",
    "splice_section",
    "write_kept",
    "write_results",
    "writer",
]
