"""Runs every section of `jaxspec bench` in one process and writes the report.

One target/draft pair, one set of held-out prompts and one warmed-up `verify.Scheduler` are
shared by the sections, so compilations are paid once. A greedy mismatch in any section
(speculative vs plain, ours vs transformers) is recorded, the report still written, and the
command exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from jaxspec.shapes import bucket
from jaxspec_apps.bench import (
    capacity,
    colocated,
    latency,
    peer,
    quality,
    real,
    report,
    verifier,
    wirecost,
)
from jaxspec_apps.bench.common import heldout_stream, machine, prompts_from, run_sections
from jaxspec_apps.bench.profile import PROFILES, SECTIONS, Profile, real_sizes


def scheduler_len(p: Profile) -> int:
    """A slot length that fits every section's sessions (prompt + new tokens + a block)."""
    g = p.gamma
    need = max(
        p.capacity_new_tokens + 2 * g + 2,
        p.latency_new_tokens + g + 1,
        p.wire_new_tokens + g + 1,
        (p.batch_steps + 3 + verifier.PROFILE_STEPS) * (g + 1) + 8 + g + 1,
        4 * g + 16,
    )
    return bucket(p.prompt_len + need, 64)


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
    return shlex.join(words)


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The keys `bench/results.json` promises, from the sections that ran."""
    s = results["sections"]
    out: dict[str, Any] = {}
    if "colocated" in s:
        p = results["profile_settings"]
        (row,) = [
            r
            for r in s["colocated"]["default_pair"]
            if r["temperature"] == 0.0 and r["gamma"] == p["gamma"] and r["mode"] == "sync"
        ]
        out["colocated_speedup"] = row["speedup"]
    if "peer" in s:
        out["peer_plain_ratio"] = s["peer"]["peer_plain_ratio"]
        out["peer_spec_ratio"] = s["peer"]["peer_spec_ratio"]
    if "verifier" in s:
        by_batch = {r["batch"]: r for r in s["verifier"]["rows"]}
        if 1 in by_batch and 32 in by_batch:
            b32 = by_batch[32]
            out["batch32_over_batch1"] = b32["ratio_to_batch1"]
            out["batch_scaling_vs_roofline"] = (
                b32["ratio_to_batch1"] / b32["roofline_ratio_to_batch1"]
            )
            out["roofline_fraction"] = {
                "batch1": by_batch[1]["roofline_fraction"],
                "batch32": b32["roofline_fraction"],
            }
    if "capacity" in s:
        out["capacity_factor_measured"] = s["capacity"]["capacity_factor_measured"]
        out["capacity_factor_predicted"] = s["capacity"]["capacity_factor_predicted"]
    if "latency" in s:
        at50 = [r for r in s["latency"]["rows"] if r["rtt_ms"] == 50]
        if at50:
            m = at50[0]["measured"]
            out["pipelined_over_sync_at_50ms"] = m["sync"] / m["pipelined"]
    if "wirecost" in s and "rows" in s["wirecost"]:
        out["wire_bytes_per_token"] = {
            r["encoding"]: r["bytes_per_token"] for r in s["wirecost"]["rows"]
        }
    if "quality" in s:
        for k in ("w4a16_bytes_ratio", "w4a16_ppl_ratio", "w4a16_alpha_ratio"):
            out[k] = s["quality"][k]
    return out


def output_dir(out: str | None) -> pathlib.Path:
    """Where the report goes: `out` when given (`.` rewrites a committed report on purpose),
    else a new temporary directory, so a trial run never overwrites the repository's files."""
    if out is not None:
        return pathlib.Path(out)
    return pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-bench-"))


def run_suite(args: argparse.Namespace) -> int:
    """Run the sections `args` selects; write BENCHMARKS.md, bench/results.json and plots
    into `--out` (default: a new temporary directory, `output_dir`)."""
    t_start = time.time()
    load_start = os.getloadavg()[0]
    name = args.profile or ("quick" if args.quick else "full")
    p = PROFILES[name]
    sections = SECTIONS if not args.sections else tuple(args.sections.split(","))
    unknown = set(sections) - set(SECTIONS) if getattr(args, "pairs", None) != "real" else ()
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    out = output_dir(args.out)
    log(f"the report goes to {out.resolve()}" + ("" if args.out else " (--out to choose)"))
    pairs = getattr(args, "pairs", None) or p.default_pairs
    if pairs not in ("tiny", "real", "both"):
        raise ValueError(f"--pairs must be tiny, real or both, got {pairs!r}")
    previous = out / "bench" / "results.json"
    if pairs == "real" and previous.is_file():
        # Only the real pair: the tiny pair's figures of the report there are kept.
        results = json.loads(previous.read_text())  # its "real": merged by a partial pass
        results["skipped"].pop("real", None)
        results["failures"] = {k: v for k, v in results["failures"].items() if "/" not in k}
        run_real(args, p, results, log, strict=True)
        write_outputs(results, out, log)
        return 1 if results["failures"] else 0
    if pairs == "real":
        raise ValueError(
            f"--pairs real adds the real pair to an existing report; {previous} is missing "
            "(run --pairs both, or the tiny pair first)"
        )

    target, draft = jaxspec.load(args.target), jaxspec.load(args.draft)
    stream = heldout_stream(target)
    n_prompts = max(p.prompts, p.peer_prompts, p.wire_prompts)
    prompts = prompts_from(stream, n_prompts, p.prompt_len, seed=0)
    log(f"profile {name}: {target.num_params():,}-param target, {draft.num_params():,}-param "
        f"draft, {len(stream):,} held-out tokens")  # fmt: skip
    results: dict[str, Any] = {
        "command": _command(args),
        "profile": name,
        "profile_settings": dataclasses.asdict(p),
        "models": {
            "target": args.target,
            "draft": args.draft,
            "target_params": target.num_params(),
            "draft_params": draft.num_params(),
            "target_bytes": target.nbytes(),
            "draft_bytes": draft.nbytes(),
        },
        "sections": {},
        "failures": {},
        "skipped": {},
    }
    shared: dict[str, Any] = {}

    def sched() -> Any:
        if "sched" not in shared:
            rows = {1, *p.batches}
            shared["sched"] = verifier.make_scheduler(
                target, rows=rows, gamma=p.gamma, max_len=scheduler_len(p)
            )
            log(f"verifier warmed up: row buckets {sorted(rows)}, slot length {scheduler_len(p)}")
        return shared["sched"]

    def run_colocated() -> dict[str, Any]:
        kw = dict(temperatures=p.temperatures, new_tokens=p.new_tokens, repeats=p.repeats)
        pair = colocated.run(
            target, draft, prompts[: p.prompts], gammas=p.gammas, modes=p.modes, **kw
        )
        self_draft = jaxspec.quantize(target, "w4a16", 128, method="asym")  # no calibration
        self_rows = colocated.run(
            target, self_draft, prompts[: p.prompts], gammas=(p.gamma,), modes=p.self_modes, **kw
        )
        return {
            "default_pair": pair,
            "self_w4a16": self_rows,
            "self_draft_bytes": self_draft.nbytes(),
        }

    def run_peer() -> dict[str, Any]:
        return peer.run(
            target, draft, peer.checkpoint_dir(args.target), peer.checkpoint_dir(args.draft),
            prompts[: p.peer_prompts], new_tokens=p.peer_new_tokens, gamma=p.gamma,
            repeats=p.repeats,
        )  # fmt: skip

    def run_capacity() -> dict[str, Any]:
        cap_prompts = prompts_from(stream, min(p.capacity_max_clients, 64), p.prompt_len, seed=1)
        return capacity.run(target, draft, cap_prompts, **capacity.sizes(p))

    def run_latency() -> dict[str, Any]:
        comp, rows = latency.run(
            target, draft, gamma=p.gamma, new_tokens=p.latency_new_tokens, temperature=0.0,
            rtts_ms=p.rtts_ms, repeats=p.repeats, prompt=prompts[0], scheduler=sched(),
        )  # fmt: skip
        return {
            "gamma": p.gamma,
            "new_tokens": p.latency_new_tokens,
            "components": comp,
            "rows": rows,
            "crossover_ms_measured": latency.crossover_ms(rows, "measured"),
            "crossover_ms_predicted": latency.predicted_crossover_ms(comp, p.gamma),
        }

    def run_verifier() -> dict[str, Any]:
        roof = verifier.measure_roofline(p.roofline_mib, p.roofline_n)
        out = verifier.batch_sweep(
            target, p.batches, p.gamma, p.prompt_len, p.batch_steps, scheduler=sched(),
            roofline=roof,
        )  # fmt: skip
        return {"gamma": p.gamma, "roofline": roof, "rows": out[1:]}

    def run_wirecost() -> dict[str, Any]:
        rows = wirecost.run(
            draft, prompts[: p.wire_prompts], sched(), gamma=p.gamma, new_tokens=p.wire_new_tokens,
            sparse_ks=p.wire_sparse_ks,
        )  # fmt: skip
        return {"gamma": p.gamma, "new_tokens": p.wire_new_tokens, "rows": rows}

    def run_quality() -> dict[str, Any]:
        return quality.w4a16_summary(
            target, draft, stream, prompts_from(stream, p.quality_prompts, p.prompt_len, seed=2),
            windows=p.quality_windows, seq_len=p.quality_seq_len,
            new_tokens=p.quality_new_tokens, gamma=p.gamma,
        )  # fmt: skip

    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "colocated": run_colocated,
        "peer": run_peer,
        "capacity": run_capacity,
        "latency": run_latency,
        "verifier": run_verifier,
        "wirecost": run_wirecost,
        "quality": run_quality,
    }
    run_sections(runners, sections, results, log)

    results["machine"] = machine() | {"load_average_1min_start": load_start}
    results |= headline(results)
    results["wall_time_s"] = time.time() - t_start
    if pairs == "both":
        run_real(args, p, results, log, strict=False)
    write_outputs(results, out, log)
    return 1 if results["failures"] else 0


def run_real(
    args: argparse.Namespace,
    p: Profile,
    results: dict[str, Any],
    log: Callable[[str], None],
    *,
    strict: bool,
) -> None:
    """The real pair's pass into `results["real"]`, its greedy mismatches into `failures`
    as `real/<section>`. When the pair cannot be had (offline, no shipped draft) it is
    `skipped` with the reason, or, `strict`, an error."""
    t0, load0 = time.time(), os.getloadavg()[0]
    target_name = getattr(args, "real_target", "smollm2")
    draft_name = getattr(args, "real_draft", "smollm2-w4a16")
    try:
        for name in (target_name, draft_name):
            peer.checkpoint_dir(name)  # fetches a remote target once; raises when it cannot
        jaxspec.load(draft_name)
    except Exception as e:  # any reason the pair is missing is reported
        if strict:
            raise
        results["skipped"]["real"] = f"the real pair is not available here: {e}"
        log(f"real pair: skipped, {e}")
        return
    sizes = real_sizes(p)
    # --sections names the real pair's sections when only it runs, else the tiny pair's.
    picked = tuple(args.sections.split(",")) if args.sections and strict else real.REAL_SECTIONS
    res = real.run(target_name, draft_name, sizes, log, picked)
    for section, err in res.pop("failures").items():
        results["failures"][f"real/{section}"] = err
    new = {
        "command": _command(args),
        "profile": sizes.name,
        "profile_settings": dataclasses.asdict(sizes),
        **res,
        "machine": machine() | {"load_average_1min_start": load0},
        "wall_time_s": time.time() - t0,
    }
    old = results.get("real")
    partial = set(picked) != set(real.REAL_SECTIONS)
    results["real"] = merge_real(old, new) if partial and old and old.get("sections") else new


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


def write_outputs(results: dict[str, Any], out: pathlib.Path, log: Callable[[str], None]) -> None:
    """`out/bench/results.json`, `out/bench/*.png` (if matplotlib is installed) and
    `out/BENCHMARKS.md`."""

    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")
    try:
        plots = report.plots(results, bench)
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        plots = {}
        print("note: matplotlib is not installed; no plots (pip install -e .[test])")
    extra = report.tool_sections(bench)  # sections the tools wrote (bench/<name>.md), kept
    (out / "BENCHMARKS.md").write_text(report.markdown(results, plots, extra))
    log(f"wrote {out / 'BENCHMARKS.md'}, {bench / 'results.json'} and {len(plots)} plots")
    if results["failures"]:
        print(f"FAILED: {results['failures']}", file=sys.stderr)
