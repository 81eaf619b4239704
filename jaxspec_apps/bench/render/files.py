"""Writing the report's files: bench/results.json and a kept block's bench/<name>.json as the
sections measured them, then BENCHMARKS.md, bench/<name>.md and the plots from those JSON
files alone (`render_report`, which `jaxspec bench --render` runs without measuring)."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

from jaxspec_apps.bench.render.page import block, markers, report
from jaxspec_apps.bench.render.tables import Page
from jaxspec_apps.bench.render.templates import KEPT, KEPT_ORDER, KEPT_PLOTS, TINY_PLOTS


def kept_md(name: str, data: dict[str, Any]) -> str:
    """Kept block `name`'s markdown (bench/<name>.md) from its results."""
    return "\n".join(KEPT[name][1](data, Page({}))) + "\n"


def splice_section(path: pathlib.Path, md: str, name: str) -> None:
    """Put (or replace) block `name` (one of `KEPT_ORDER`) in the report at `path`: in place
    if it is there, else before "## Reproduce", else at the end."""
    begin, end = markers(name)
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block(name, md) + ("\n" + tail if tail else "")
    elif "\n## Reproduce" in text:
        head, tail = text.split("\n## Reproduce", 1)
        text = head.rstrip("\n") + "\n\n" + block(name, md) + "\n## Reproduce" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block(name, md)
    path.write_text(text)


def write_kept(
    out: pathlib.Path,
    name: str,
    result: dict[str, Any],
    md: str | None = None,
    splice: bool = True,
) -> pathlib.Path:
    """A kept block's run into `out`: bench/<name>.json, bench/<name>.md (`md`, or rendered
    from `result` by its template) and (`splice`) its block of out/BENCHMARKS.md
    (`splice_section`; a suite run writing the whole report reads bench/<name>.md instead);
    returns out/bench."""
    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = kept_md(name, result) if md is None else md
    (bench / f"{name}.md").write_text(md)
    if splice:
        splice_section(out / "BENCHMARKS.md", md, name)
    return bench


def render_report(
    src: pathlib.Path, dst: pathlib.Path | None = None, plots: dict[str, str] | None = None
) -> pathlib.Path:
    """BENCHMARKS.md and bench/<name>.md into `dst` (default `src`) from the JSON in
    src/bench: results.json and each kept block's <name>.json (bench/quant.md, which
    tools/quant_table.py writes itself, is carried as it is). `plots`: the plots drawn (key
    -> path), by default those the results have data for. Without results.json, each kept
    block is put in dst/BENCHMARKS.md in place. Returns dst/BENCHMARKS.md."""
    dst = src if dst is None else dst
    (dst / "bench").mkdir(parents=True, exist_ok=True)
    kept: dict[str, str] = {}
    for name in KEPT_ORDER:
        data, md = src / "bench" / f"{name}.json", src / "bench" / f"{name}.md"
        if name in KEPT and data.is_file():
            kept[name] = kept_md(name, json.loads(data.read_text()))
        elif name not in KEPT and md.is_file():
            kept[name] = md.read_text()
        else:
            continue
        (dst / "bench" / f"{name}.md").write_text(kept[name])
    path = dst / "BENCHMARKS.md"
    results = src / "bench" / "results.json"
    if not results.is_file():
        if src != dst and (src / "BENCHMARKS.md").is_file():
            shutil.copyfile(src / "BENCHMARKS.md", path)
        for name, md in kept.items():
            splice_section(path, md, name)
        return path
    r = json.loads(results.read_text())
    path.write_text(report(r, plot_paths(r) if plots is None else plots, kept))
    return path


def plot_paths(results: dict[str, Any]) -> dict[str, str]:
    """The tiny pair's plots `results` has data for: key -> path from the report (what
    `draw_plots` gives, known without matplotlib)."""
    s = results["sections"]
    return {
        key: f"bench/{key}.png"
        for name, (key, _, has) in TINY_PLOTS.items()
        if name in s and has(s[name])
    }


def draw_plots(results: dict[str, Any], bench: pathlib.Path) -> dict[str, str]:
    """Each tiny-pair section's plot into `bench`; key -> path from the report. Raises
    ModuleNotFoundError without matplotlib."""
    out: dict[str, str] = {}
    for name, (_, draw, has) in TINY_PLOTS.items():
        if name in results["sections"] and has(results["sections"][name]):
            out |= draw(results["sections"][name], bench)
    return out


def draw_kept_plot(name: str, data: dict[str, Any], bench: pathlib.Path) -> None:
    """Kept block `name`'s plot (if it has one) into `bench`; a note without matplotlib."""
    if name in KEPT_PLOTS:
        try:
            KEPT_PLOTS[name](data, bench)
        except ModuleNotFoundError as e:  # matplotlib: the test extra
            print(f"note: no plot ({e.name} is not installed)")


def write_results(results: dict[str, Any], out: pathlib.Path, log: Callable[[str], None]) -> None:
    """`out/bench/results.json`, `out/bench/*.png` (if matplotlib is installed), then
    `out/BENCHMARKS.md` and the kept blocks' markdown from the JSON there."""
    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    try:
        drawn = draw_plots(results, bench)
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        drawn = {}
        print("note: matplotlib is not installed; no plots (pip install -e .[test])")
    render_report(out, plots=drawn)
    log(f"wrote {out / 'BENCHMARKS.md'}, {bench / 'results.json'} and {len(drawn)} plots")
