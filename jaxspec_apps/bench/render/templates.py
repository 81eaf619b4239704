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

import jaxspec_apps.bench.render.adaptive as adaptive
import jaxspec_apps.bench.render.capacity as capacity
import jaxspec_apps.bench.render.colocated as colocated
import jaxspec_apps.bench.render.cost as cost
import jaxspec_apps.bench.render.fleet as fleet
import jaxspec_apps.bench.render.int4 as int4
import jaxspec_apps.bench.render.kernels as kernels
import jaxspec_apps.bench.render.latency as latency
import jaxspec_apps.bench.render.llamacpp as llamacpp
import jaxspec_apps.bench.render.openai as openai
import jaxspec_apps.bench.render.peer as peer
import jaxspec_apps.bench.render.quality as quality
import jaxspec_apps.bench.render.roundprofile as roundprofile
import jaxspec_apps.bench.render.specbench as specbench
import jaxspec_apps.bench.render.target as target
import jaxspec_apps.bench.render.twoproc as twoproc
import jaxspec_apps.bench.render.verifier as verifier
import jaxspec_apps.bench.render.wirecost as wirecost
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
