"""The `jaxspec bench` command line: its options and its entry point (the package's
docstring says what the suite measures)."""

from __future__ import annotations

import argparse

from jaxspec_apps.bench.profile import PROFILES
from jaxspec_apps.bench.real import REAL_SECTIONS
from jaxspec_apps.bench.suite import PAIRS, run_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `jaxspec bench` options (the CLI calls this while building its parser)."""
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, under two minutes (no speed claims)"
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="sizes: full (default), quick (= --quick), tiny (seconds, for tests with tiny "
        "checkpoints)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="directory for BENCHMARKS.md and bench/ (default: a new temporary directory, "
        "printed; `--out .` in the repository rewrites the committed report)",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rewrite BENCHMARKS.md and bench/*.md in --out (default: the "
        "current directory) from the JSON there (bench/results.json, bench/<section>.json)",
    )
    parser.add_argument(
        "--pairs",
        choices=PAIRS,
        default=None,
        help="which pairs to measure: the tiny one, the real one (SmolLM2 and its draft; "
        "added to the report already in --out), or both (the full profile's default); "
        "gemma3: Gemma 3 270M and its W4A16 copy (added to the report already in --out)",
    )
    for flag, default, what in (
        ("--target", "default", "tiny pair: target (dir or name)"),
        ("--draft", "default-draft", "tiny pair: draft"),
        ("--real-target", "smollm2", "real pair: target"),
        ("--real-draft", "smollm2-w4a16", "real pair: draft (smollm2-draft: the small one)"),
    ):
        parser.add_argument(flag, default=default, help=what)
    parser.add_argument(
        "--sections",
        default=None,
        help="comma-separated subset of the suite's sections (default: all); the report then "
        "has only those. With --pairs real, the real pair's ("
        + ", ".join(REAL_SECTIONS)
        + "). Sections kept "
        "apart run only when named here, each into its own block of BENCHMARKS.md: adaptive, "
        "fleet, openai (tiny pair), target, int4, two_process, round_profile (real pair)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="set one size of the profile for this run (repeatable): e.g. gammas=2,4, "
        "rtts_ms=0,20, fleet_seconds=20, openai_repeats=11 (a size the profile shares, or a "
        "field of a section's Config after its PREFIX: jaxspec_apps.bench.profile)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the suite as `args` says; 0 on success."""

    return run_suite(args)
