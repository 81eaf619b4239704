"""Runs the sections of `jaxspec bench` in one process and writes the report.

One target/draft pair, one set of held-out prompts and one warmed-up `verify.Scheduler` are
shared by the sections of a pass (`section.Context`), so compilations are paid once. A greedy
mismatch in any section (speculative vs plain, ours vs transformers) is recorded, the report
still written, and the command exits 1. The sections kept apart (`tiny.KEPT`, `real.KEPT`) run
only when `--sections` names them, each into its own block of the report.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jaxspec
from jaxspec_apps.bench import peer, real, render, tiny
from jaxspec_apps.bench.common import machine
from jaxspec_apps.bench.profile import (
    PROFILES,
    Profile,
    real_sizes,
    suite_settings,
    with_settings,
)
from jaxspec_apps.bench.section import Context, Section, run_sections

Log = Callable[[str], None]
PAIRS = ("tiny", "real", "both", *(k for k in real.REAL_PASSES if k != "real"))


def _command(args: argparse.Namespace) -> str:
    words = ["jaxspec", "bench"]
    if args.profile:
        words += ["--profile", args.profile]
    elif args.quick:
        words.append("--quick")
    if getattr(args, "pairs", None):
        words += ["--pairs", args.pairs]
    for flag, default in (
        ("target", "default"),
        ("draft", "default-draft"),
        ("real_target", "smollm2"),
        ("real_draft", "smollm2-w4a16"),
        ("out", None),
    ):
        if not hasattr(args, flag):
            continue
        if getattr(args, flag) != default:
            words += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.sections:
        words += ["--sections", args.sections]
    for item in getattr(args, "set", None) or ():
        words += ["--set", item]
    return shlex.join(words)


def output_dir(out: str | None) -> pathlib.Path:
    """Where the report goes: `out` when given (`.` rewrites a committed report on purpose),
    else a new temporary directory, so a trial run never overwrites the repository's files."""
    if out is not None:
        return pathlib.Path(out)
    return pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-bench-"))


def sizes(args: argparse.Namespace) -> tuple[str, Profile, Profile]:
    """(the profile's name, the tiny pair's sizes, the real pair's), `--set` applied."""
    name = args.profile or ("quick" if args.quick else "full")
    items = getattr(args, "set", None) or ()
    p = with_settings(PROFILES[name], items)
    return name, p, with_settings(real_sizes(p), items)


def _suite(pairs: str) -> tuple[Section, ...]:
    """The sections of the first pass `--pairs` asks for."""
    return real.REAL_PASSES[pairs][2] if pairs in real.REAL_PASSES else tiny.SECTIONS


def selected(
    args: argparse.Namespace, pairs: str
) -> tuple[tuple[str, ...] | None, list[tuple[str, Section]]]:
    """(the suite sections `--sections` names for the first pass, all without it, None when
    it names only kept sections; the kept sections it names, each with its pair)."""
    suite = tuple(s.name for s in _suite(pairs))
    kept = {s.name: ("tiny", s) for s in tiny.KEPT} if pairs not in real.REAL_PASSES else {}
    if pairs in ("real", "both"):
        kept |= {s.name: ("real", s) for s in real.KEPT}
    if not args.sections:
        return suite, []
    asked = tuple(args.sections.split(","))
    unknown = set(asked) - set(suite) - set(kept)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {suite + tuple(kept)}")
    names = tuple(n for n in asked if n not in kept)
    return names or None, [kept[n] for n in asked if n in kept]


def context(args: argparse.Namespace, pair: str, p: Profile, log: Log) -> Context:
    """A pass's context: the pair's checkpoint names from `args`, models loaded on use."""
    if pair in real.REAL_PASSES:
        names = real.REAL_PASSES[pair][:2]
        if pair == "real":  # --real-target / --real-draft choose the first real pair's models
            names = getattr(args, "real_target", names[0]), getattr(args, "real_draft", names[1])
    else:
        names = args.target, args.draft
    return Context(pair, p, log, *names, command=_command(args))


def run_suite(args: argparse.Namespace) -> int:
    """Run the sections `args` selects; write BENCHMARKS.md, bench/results.json and plots
    into `--out` (default: a new temporary directory, `output_dir`). `--render`: measure
    nothing, re-render the report in `--out` (default: here) from its JSON."""
    if getattr(args, "render", False):
        path = render.render_report(pathlib.Path(args.out or "."))
        print(f"wrote {path} and its blocks' bench/*.md from the JSON in {path.parent / 'bench'}")
        return 0
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    name, p, real_p = sizes(args)
    pairs = getattr(args, "pairs", None) or p.default_pairs
    if pairs not in PAIRS:
        raise ValueError(f"--pairs must be one of {', '.join(PAIRS)}, got {pairs!r}")
    names, kept = selected(args, pairs)
    out = output_dir(args.out)
    log(f"the report goes to {out.resolve()}" + ("" if args.out else " (--out to choose)"))
    previous = out / "bench" / "results.json"
    if pairs in real.REAL_PASSES and names is not None and not previous.is_file():
        raise ValueError(
            f"--pairs {pairs} adds a real pair to an existing report; {previous} is missing "
            "(run --pairs both, or the tiny pair first)"
        )
    results = None
    if names is not None and pairs in real.REAL_PASSES:
        # Only a real pair: the other pairs' figures of the report there are kept.
        results = json.loads(previous.read_text())  # its pass: merged by a partial pass
        results["skipped"].pop(pairs, None)
        results["failures"] = {
            k: v for k, v in results["failures"].items() if not k.startswith(f"{pairs}/")
        }
        run_real(args, real_p, results, log, strict=True, names=names, key=pairs)
    elif names is not None:
        results = run_tiny(args, name, p, names, log)
        results["wall_time_s"] = time.time() - t_start
        if pairs == "both":
            run_real(args, real_p, results, log, strict=False)
    failed = run_kept(args, kept, p, real_p, out, log, splice=results is None)
    if results is not None:
        render.write_results(results, out, log)
        if results["failures"]:
            print(f"FAILED: {results['failures']}", file=sys.stderr)
        failed = failed or bool(results["failures"])
    return 1 if failed else 0


def run_tiny(
    args: argparse.Namespace, name: str, p: Profile, names: tuple[str, ...], log: Log
) -> dict[str, Any]:
    """The tiny pair's pass over the sections `names`, in that order; its results."""
    load_start = os.getloadavg()[0]
    ctx = context(args, "tiny", p, log)
    tiny.prepare(ctx)
    target, draft = ctx.target, ctx.draft
    log(f"profile {name}: {target.num_params():,}-param target, {draft.num_params():,}-param "
        f"draft, {len(ctx.stream):,} held-out tokens")  # fmt: skip
    results: dict[str, Any] = {
        "command": ctx.command,
        "profile": name,
        "profile_settings": suite_settings(p),
        "models": tiny.models(ctx),
        "sections": {},
        "failures": {},
        "skipped": {},
    }
    by_name = {s.name: s for s in tiny.SECTIONS}
    run_sections([by_name[n] for n in names], ctx, results)
    results["machine"] = machine() | {"load_average_1min_start": load_start}
    return results | tiny.headline(results)


def run_real(
    args: argparse.Namespace,
    p: Profile,
    results: dict[str, Any],
    log: Log,
    *,
    strict: bool,
    names: tuple[str, ...] = real.REAL_SECTIONS,
    key: str = "real",
) -> None:
    """A real pair's pass (`key`: "real", SmolLM2's, or "gemma3") over `names` into
    `results[key]`, its greedy mismatches into `failures` as `<key>/<section>`. When the pair
    cannot be had (offline, no shipped draft) it is `skipped` with the reason, or, `strict`,
    an error."""
    t0, load0 = time.time(), os.getloadavg()[0]
    ctx = context(args, key, p, log)
    try:
        for name in (ctx.target_name, ctx.draft_name):
            peer.checkpoint_dir(name)  # fetches a remote target once; raises when it cannot
        jaxspec.load(ctx.draft_name)
    except Exception as e:  # any reason the pair is missing is reported
        if strict:
            raise
        results["skipped"][key] = f"the real pair is not available here: {e}"
        log(f"{key} pair: skipped, {e}")
        return
    real.prepare(ctx)
    t, d = ctx.target, ctx.draft
    log(f"{key} pair: {t.num_params():,}-param target {ctx.target_name}, "
        f"{d.num_params():,}-param draft {ctx.draft_name} ({d.nbytes():,} bytes)")  # fmt: skip
    res: dict[str, Any] = {"models": real.models(ctx), "sections": {}, "failures": {}}
    by_name = {s.name: s for s in _suite(key)}
    run_sections([by_name[n] for n in names], ctx, res, prefix=f"{key} ")
    res |= real.headline(res)
    for section, err in res.pop("failures").items():
        results["failures"][f"{key}/{section}"] = err
    new = {
        "command": ctx.command,
        "profile": p.name,
        "profile_settings": suite_settings(p),
        **res,
        "machine": machine() | {"load_average_1min_start": load0},
        "wall_time_s": time.time() - t0,
    }
    old = results.get(key)
    partial = set(names) != {s.name for s in _suite(key)}
    results[key] = merge_real(old, new) if partial and old and old.get("sections") else new


def merge_real(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A pass over some of the real pair's sections, into the committed one: its sections and
    headline keys replace those of `old`; the rest of `old` stays, and `earlier_runs` says
    which sections came from which earlier command. Every headline value is still a ratio
    measured within one run (the new run's keys come from its own sections only)."""
    kept = {k: v for k, v in old["sections"].items() if k not in new["sections"]}
    headline_old = {k: v for k, v in old.items() if k not in _REAL_META}
    earlier = [e for e in old.get("earlier_runs", []) if set(e["sections"]) & set(kept)]
    for e in earlier:
        e["sections"] = [x for x in e["sections"] if x in kept]
    own = [x for x in kept if not any(x in e["sections"] for e in earlier)]
    if own:
        earlier.append({k: old[k] for k in ("command", "wall_time_s", "machine") if k in old}
                       | {"sections": own})  # fmt: skip
    merged = headline_old | new
    merged["sections"] = kept | new["sections"]
    merged["earlier_runs"] = earlier
    return merged


# `results["real"]` keys that describe a run rather than measure (see `run_real`).
_REAL_META = frozenset(
    {"command", "profile", "profile_settings", "sections", "failures", "machine",
     "wall_time_s", "earlier_runs", "models"}
)  # fmt: skip


def run_kept(
    args: argparse.Namespace,
    kept: list[tuple[str, Section]],
    p: Profile,
    real_p: Profile,
    out: pathlib.Path,
    log: Log,
    *,
    splice: bool,
) -> bool:
    """Each kept section named, in its pair's context: printed, written to bench/<name>.json,
    .md and its plot, and (`splice`, when no suite pass rewrites the report) put in
    BENCHMARKS.md in place. True when one of them failed (`Section.failures`)."""
    failed = False
    for pair, section in kept:
        ctx = context(args, pair, real_p if pair == "real" else p, log)
        data = section.run(ctx)
        if "skipped" in data:
            log(f"{section.name}: skipped, {data['skipped']}")
            continue
        bench = render.write_kept(out, section.name, data, splice=splice)
        print((bench / f"{section.name}.md").read_text())
        render.draw_kept_plot(section.name, data, bench)
        log(f"wrote {bench / section.name}.json, .md and BENCHMARKS.md's block")
        errors = section.failures(data)
        if errors:
            print(f"FAILED: {errors}", file=sys.stderr)
            failed = True
    return failed
