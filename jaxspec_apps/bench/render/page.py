"""The pages of the report: BENCHMARKS.md from the results of a run (`bench/results.json`)
and the blocks kept apart.

Every number printed comes from the results (what the run measured); the sentences that say
who is ahead are chosen by those numbers, so a rerun on another machine says what it saw. Each
section's template (`templates`) writes its own lines; this module puts them in order under
each pair's header and headline table, and carries each kept block between markers naming the
command that writes it, so a rerun of that section replaces it in place.
"""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.headline import behind, real_table, tiny_table
from jaxspec_apps.bench.render.tables import Page, machine_line
from jaxspec_apps.bench.render.templates import KEPT, REAL, TINY, Template


def writer(name: str) -> str:
    """The command that writes block `name` (its markers name it)."""
    if name == "quant":
        return "tools/quant_table.py"
    return f"jaxspec bench --pairs {KEPT[name][0]} --sections {name}"


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close block `name` in BENCHMARKS.md."""
    command = writer(name)
    return f"<!-- begin: written by {command}, rerun it to update -->", f"<!-- end: {command} -->"


def block(name: str, md: str) -> str:
    """Kept block `name` (its markdown `md`) between its markers."""
    begin, end = markers(name)
    return f"{begin}\n{md.rstrip()}\n{end}\n"


def _sections_md(templates: dict[str, Template], page: Page) -> list[str]:
    """Each section's lines, in the pair's order, for those the pass measured."""
    lines: list[str] = []
    for name, template in templates.items():
        if name in page.sections:
            lines += template(page.sections[name], page)
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
    lines += ["", "## Headline numbers", "", *tiny_table(r)]
    notes = behind(r)
    if notes:
        lines += ["", "## Where we are behind", ""] + [f"- {n}" for n in notes]
    return lines + _sections_md(TINY, Page(r, plots))


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
        *real_table(r),
        *_sections_md(REAL, Page(r)),
    ]
    if r.get("skipped"):
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    return lines


def report(r: dict[str, Any], plots: dict[str, str], extra: dict[str, str] | None = None) -> str:
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
        lines += ["", block(name, md).rstrip("\n")]
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
