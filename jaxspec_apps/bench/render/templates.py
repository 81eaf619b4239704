"""Which template writes which section's part of the report, in the report's order, and which
plots the report shows.

`TINY` and `REAL` list the sections of the tiny pair's and a real pair's part in the order
they are printed (the passes of `jaxspec_apps.bench.tiny` and `.real` run them in this order;
the Gemma pass runs a subset of `REAL`). `KEPT` are the blocks kept apart (each its own
bench/<name>.json and .md and a block of BENCHMARKS.md), `KEPT_ORDER` their order in the
report, with `quant` (tools/quant_table.py's, whose markdown it writes itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxspec_apps.bench.render import (
    adaptive,
    capacity,
    colocated,
    cost,
    fleet,
    int4,
    kernels,
    latency,
    llamacpp,
    openai,
    peer,
    quality,
    roundprofile,
    specbench,
    target,
    twoproc,
    verifier,
    wirecost,
)
from jaxspec_apps.bench.render.tables import Page

Template = Callable[[dict[str, Any], Page], list[str]]
Plotter = Callable[[dict[str, Any], Any], dict[str, str]]

TINY: dict[str, Template] = {
    "colocated": colocated.markdown_tiny,
    "peer": peer.markdown_tiny,
    "capacity": capacity.markdown_tiny,
    "latency": latency.markdown_tiny,
    "verifier": verifier.markdown_tiny,
    "wirecost": wirecost.markdown_tiny,
    "quality": quality.markdown_tiny,
}
REAL: dict[str, Template] = {
    "specbench": specbench.markdown,
    "cost": cost.markdown,
    "kernels": kernels.markdown,
    "colocated": colocated.markdown_real,
    "peer": peer.markdown_real,
    "verifier": verifier.markdown_real,
    "capacity": capacity.markdown_real,
    "latency": latency.markdown_real,
    "wirecost": wirecost.markdown_real,
    "quality": quality.markdown_real,
    "llamacpp": llamacpp.markdown,
}
# kept block -> (the pair whose `--sections` runs it, its template)
KEPT: dict[str, tuple[str, Template]] = {
    "target": ("real", target.markdown),
    "adaptive": ("tiny", adaptive.markdown),
    "fleet": ("tiny", fleet.markdown),
    "openai": ("tiny", openai.markdown),
    "int4": ("real", int4.markdown),
    "two_process": ("real", twoproc.markdown),
    "round_profile": ("real", roundprofile.markdown),
}
KEPT_ORDER = (
    "target",
    "adaptive",
    "fleet",
    "quant",
    "openai",
    "int4",
    "two_process",
    "round_profile",
)


def _always(data: dict[str, Any]) -> bool:
    return True


# The tiny pair's plots: section -> (the plot's key, draws it, whether its data has one).
TINY_PLOTS: dict[str, tuple[str, Plotter, Callable[[dict[str, Any]], bool]]] = {
    "colocated": ("colocated", colocated.plot, _always),
    "peer": ("peer", peer.plot, _always),
    "capacity": ("capacity", capacity.plot, capacity.has_plot),
    "latency": ("rtt", latency.plot_section, _always),
    "verifier": ("batch", verifier.plot, _always),
    "wirecost": ("wire", wirecost.plot, _always),
}
KEPT_PLOTS: dict[str, Plotter] = {"adaptive": adaptive.plot_section, "two_process": twoproc.plot}
