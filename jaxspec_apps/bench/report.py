"""The one report writer of `jaxspec bench`: BENCHMARKS.md, bench/results.json and the plots
for both pairs, and the blocks of the sections kept apart.

Every number printed comes from the results (what the run measured); the sentences that say
who is ahead are chosen by those numbers, so a rerun on another machine says what it saw. Each
section writes its own lines (`Section.markdown`); this module puts them in order under each
pair's header and headline table. A section kept apart (`--sections adaptive`, ...) and
`tools/quant_table.py` write `bench/<name>.json` and `bench/<name>.md`; the report carries
that block between markers naming the command that wrote it, so a suite run keeps it and a
rerun of that section replaces it in place.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from jaxspec_apps.bench import real, tiny
from jaxspec_apps.bench.report_tables import machine_line
from jaxspec_apps.bench.section import Page

# The blocks kept apart from the suite, in the report's order; `quant` is tools/quant_table.py's.
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


def writer(name: str) -> str:
    """The command that writes block `name` (its markers name it)."""
    if name == "quant":
        return "tools/quant_table.py"
    pair = "real" if name in {s.name for s in real.KEPT} else "tiny"
    return f"jaxspec bench --pairs {pair} --sections {name}"


def _markers(name: str) -> tuple[str, str]:
    command = writer(name)
    return f"<!-- begin: written by {command}, rerun it to update -->", f"<!-- end: {command} -->"


def _block(name: str, md: str) -> str:
    begin, end = _markers(name)
    return f"{begin}\n{md.rstrip()}\n{end}\n"


def splice_section(path: pathlib.Path, md: str, name: str) -> None:
    """Put (or replace) block `name` (one of `KEPT_ORDER`) in the report at `path`: in place
    if it is there, else before "## Reproduce", else at the end."""
    begin, end = _markers(name)
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + _block(name, md) + ("\n" + tail if tail else "")
    elif "\n## Reproduce" in text:
        head, tail = text.split("\n## Reproduce", 1)
        text = head.rstrip("\n") + "\n\n" + _block(name, md) + "\n## Reproduce" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + _block(name, md)
    path.write_text(text)


def write_kept(
    out: pathlib.Path, name: str, result: dict[str, Any], md: str, splice: bool = True
) -> pathlib.Path:
    """A kept block's run into `out`: bench/<name>.json and bench/<name>.md, and (`splice`)
    its block of out/BENCHMARKS.md (`splice_section`; a suite run writing the whole report
    reads bench/<name>.md instead); returns out/bench."""
    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (bench / f"{name}.md").write_text(md)
    if splice:
        splice_section(out / "BENCHMARKS.md", md, name)
    return bench


def kept_sections(bench: pathlib.Path) -> dict[str, str]:
    """The kept blocks present in `bench/` (name -> markdown), in the report's order."""
    files = {n: bench / f"{n}.md" for n in KEPT_ORDER}
    return {n: f.read_text() for n, f in files.items() if f.is_file()}


def _sections_md(sections: tuple[Any, ...], page: Page) -> list[str]:
    """Each section's lines, in the pair's order, for those the pass measured."""
    lines: list[str] = []
    for section in sections:
        if section.name in page.sections:
            lines += section.markdown(page.sections[section.name], page)
    return lines


def tiny_page(r: dict[str, Any], plots: dict[str, str]) -> list[str]:
    """The tiny pair's part: how it was produced, the headline table, where we are behind,
    then its sections."""
    p, mdl = r["profile_settings"], r["models"]
    lines = [
        f"Produced by `{r['command']}` (profile `{r['profile']}`, {r['wall_time_s'] / 60:.1f} min) "
        f"on {machine_line(r)}. Every number below was measured in that one run; speeds are "
        "compared only as ratios within it. Target: "
        f"`{mdl['target']}` ({mdl['target_params']:,} parameters), draft: `{mdl['draft']}` "
        f"({mdl['draft_params']:,}); prompts are windows of {p['prompt_len']} tokens from the "
        "documents held out of the pair's training. Machine-readable: `bench/results.json`.",
    ]
    if r["profile"] != "full":
        lines += [
            "",
            f"**This is the `{r['profile']}` profile: tiny sizes that keep the code running, not "
            "measurements to quote.**",
        ]
    if r["failures"]:
        lines += ["", "## FAILED", ""]
        lines += [f"- {k}: {v}" for k, v in r["failures"].items()]
    if r["skipped"]:
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    lines += ["", "## Headline numbers", "", *tiny.headline_table(r)]
    notes = tiny.behind(r)
    if notes:
        lines += ["", "## Where we are behind", ""] + [f"- {n}" for n in notes]
    return lines + _sections_md(tiny.SECTIONS, Page(r, plots))


def real_page(r: dict[str, Any], key: str = "real") -> list[str]:
    """A real pair's part (`results["real"]`, or `results["gemma3"]` for `key` "gemma3"): how
    it was produced, which sections come from earlier runs, the headline table, then its
    sections."""
    m = r["models"]
    title = "The real pair" if key == "real" else "A second real pair"
    prompts = (
        "Prompts are chat-formatted questions"
        if key == "real"
        else "It is a base model: prompts are the same questions as plain text"
    )
    lines = [
        f"## {title}: `{m['target']}` and its draft `{m['draft']}`",
        "",
        f"Produced by `{r['command']}` in the same run ({r['wall_time_s'] / 60:.1f} min of it) "
        f"on {machine_line(r)}. Target `{m['target']}` ({m['target_params']:,} parameters, "
        f"{m['target_bytes']:,} bytes as loaded), draft `{m['draft']}` "
        f"({m['draft_params']:,} parameters, {m['draft_bytes']:,} bytes resident, "
        f"{m['draft_quantization'] or 'float'}). {prompts} written for the benchmark "
        "(`jaxspec_apps/bench/specbench.py`), none from the draft's training. "
        f"Machine-readable: `bench/results.json`, object `{key}`.",
        *(
            f"Sections {', '.join(e['sections'])} (and their headline keys) come from an "
            f"earlier run, `{e['command']}` ({e['wall_time_s'] / 60:.1f} min)."
            for e in r.get("earlier_runs", [])
        ),
        "",
        *real.headline_table(r),
        *_sections_md(real.REAL_PASSES[key][2], Page(r)),
    ]
    if r.get("skipped"):
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    return lines


def markdown(r: dict[str, Any], plots: dict[str, str], extra: dict[str, str] | None = None) -> str:
    """The whole report: the real pair (when measured) heading the tiny pair, whose headings
    then nest one level down; the kept blocks `extra` (name -> markdown); how to reproduce."""
    lines = tiny_page(r, plots)
    if "real" in r:
        nested = [("#" + ln) if ln.startswith("##") else ln for ln in lines]
        lines = [
            "# Benchmarks",
            "",
            "Two pairs: the real one (SmolLM2-135M-Instruct and its own W4A16 copy), then "
            "the tiny pair trained here, which runs in seconds and keeps every section honest."
            + (
                " Between them a second real pair, Gemma 3 270M and its W4A16 copy, whose "
                "drafts are rejected at times."
                if "gemma3" in r
                else ""
            ),
            "",
            *real_page(r["real"]),
            "",
            *([*real_page(r["gemma3"], "gemma3"), ""] if "gemma3" in r else []),
            "## The tiny pair (5.4M parameters, trained here)",
            "",
            *nested,
        ]
    else:
        lines = ["# Benchmarks", "", *lines]
    for name, md in (extra or {}).items():
        lines += ["", _block(name, md).rstrip("\n")]
    lines += [
        "",
        "## Reproduce",
        "",
        "```bash",
        "pip install -e .[test]   # torch (the peer) and matplotlib (the plots)",
        r["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def plots(r: dict[str, Any], bench: pathlib.Path) -> dict[str, str]:
    """Each tiny-pair section's plot (those that draw one) into `bench`; key -> path from the
    report. Raises ModuleNotFoundError without matplotlib."""
    out: dict[str, str] = {}
    for section in tiny.SECTIONS:
        if section.plot is not None and section.name in r["sections"]:
            out |= section.plot(r["sections"][section.name], bench)
    return out


def write(results: dict[str, Any], out: pathlib.Path, log: Callable[[str], None]) -> None:
    """`out/bench/results.json`, `out/bench/*.png` (if matplotlib is installed) and
    `out/BENCHMARKS.md` with the kept blocks found in `out/bench`."""
    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    try:
        drawn = plots(results, bench)
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        drawn = {}
        print("note: matplotlib is not installed; no plots (pip install -e .[test])")
    (out / "BENCHMARKS.md").write_text(markdown(results, drawn, kept_sections(bench)))
    log(f"wrote {out / 'BENCHMARKS.md'}, {bench / 'results.json'} and {len(drawn)} plots")
    if results["failures"]:
        print(f"FAILED: {results['failures']}", file=sys.stderr)
