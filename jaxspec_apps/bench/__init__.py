"""`jaxspec bench`: every benchmark of the project, one command for the whole report.

    jaxspec bench                 # the full profile: the real pair (SmolLM2 + its W4A16
                                  # draft) and the tiny pair; BENCHMARKS.md,
                                  # bench/results.json and bench/*.png in a new temporary
                                  # directory (printed), never over the committed report
    jaxspec bench --pairs real --out .   # only the real pair, into the committed report
    jaxspec bench --out .         # into the current directory: rewrites the committed report
    jaxspec bench --quick         # tiny sizes, under two minutes: keeps the code from rotting
    jaxspec bench --pairs tiny --sections adaptive --out .   # one kept section, in place
    jaxspec bench --pairs tiny --sections colocated --set gammas=2,4,6   # any profile size
    jaxspec bench --render        # no measuring: BENCHMARKS.md and bench/*.md from bench/*.json

Each section is an object (`section.Section`: how it measures) in the module that measures
it, returning a dict; a pair lists its sections (`tiny`, `real`). `render` is the one writer:
BENCHMARKS.md, bench/*.md and the plots from the JSON alone (one template per section).
The tiny pair's suite, in order:
  colocated  speculative vs plain decoding on the shipped pair and on self-speculation
  peer       the same checkpoints in HF transformers (plain and assisted generation), greedy
             tokens asserted identical to ours
  capacity   clients one verifier sustains at a fixed per-client rate: cloud autoregressive,
             co-located SD, edge-cloud SD, against the (1 + gamma*t_d/t_v) prediction
  latency    the RTT sweep (sync / pipelined edge-cloud vs co-located and cloud AR)
  verifier   the verify step's batch sweep against this machine's roofline
  wirecost   bytes per committed token on the gRPC wire for each draft encoding
  quality    the W4A16 draft against the unquantized one: bytes, perplexity, alpha
The real pair adds `specbench` (Spec-Bench's per-category speedup and mean accepted tokens),
`cost` (each model's decode time against the roofline) and `kernels` (the float kernel against
XLA's ops: matmuls by rows and format, the target's forward by shape).

Kept apart, run only when `--sections` names them, each its own block of BENCHMARKS.md
(between markers naming the command) and its own bench/<name>.json and .md:
  adaptive   (tiny) gamma="auto" against every fixed gamma over round trips 0-200 ms
  fleet      (tiny) two verifier replicas: aggregate tokens/s, and a SIGKILL's failover
  openai     (tiny) the OpenAI-compatible endpoint's overhead over edge sessions
  target     (real) plain greedy decoding, jaxspec vs transformers, against the roofline
  int4       (real) the int4 kernel against XLA's paths on SmolLM2's shapes
  two_process (real) the edge and the verifier as two pinned processes over gRPC, against
             cloud decoding streamed and the verifier's gamma-0 sessions
  round_profile (real) each jitted program against its forwards (program_vs_parts), where
             each mode's time goes and where the edge sessions stall

Only numbers measured in the run are reported; speed is compared as ratios within the run.
"""

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
