"""Adaptive gamma (`gamma="auto"`) against every fixed gamma, over round trips 0-200 ms and
two draft pairs of high and low acceptance, in one run:

    python tools/bench_adaptive.py                 # prints the table
    python tools/bench_adaptive.py --out .         # also bench/adaptive.{json,md,png} and the
                                                   # "Adaptive gamma" section of BENCHMARKS.md
    python tools/bench_adaptive.py --tiny          # random tiny checkpoints (tests)

Pairs (the shipped target, greedy, pipelined): `self` drafts with the target itself at W4A16
(each draft as costly as a target step), the other with the shipped draft at W4A16 (a fraction
of the cost); the table's α is each point's measured acceptance (accepted / drafted). See
`jaxspec_apps/bench/adaptive.py` for what is timed. Exit status 1 if any auto run's tokens
differ from the fixed runs'.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import jaxspec
from jaxspec.testing import write_random_checkpoint
from jaxspec_apps.bench import adaptive
from jaxspec_apps.bench.common import heldout_stream, prompts_from
from jaxspec_apps.bench.report import write_tool_section
from jaxspec_apps.bench.verifier import make_scheduler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rtts-ms", default="0,20,50,100,200")
    p.add_argument("--max-gamma", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--tiny", action="store_true", help="random tiny checkpoints (tests)")
    p.add_argument("--out", default=None, help="directory holding BENCHMARKS.md and bench/")
    args = p.parse_args(argv)
    rtts = [float(x) for x in args.rtts_ms.split(",")]

    if args.tiny:
        d = pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-adaptive-"))
        target = jaxspec.load(write_random_checkpoint(d / "t", seed=0))
        drafts = {"self": jaxspec.quantize(target, "w4a16", 16, method="asym")}
        prompts = [[1, 2, 3, 4, 5, 6, 7, 8]][: args.prompts]
    else:
        target = jaxspec.load("default")
        drafts = {
            "self (target at W4A16)": jaxspec.quantize(target, "w4a16", 128, method="asym"),
            "shipped draft at W4A16": jaxspec.quantize(
                jaxspec.load("default-draft"), "w4a16", 128, method="asym"
            ),
        }
        prompts = prompts_from(heldout_stream(target), args.prompts, 32, seed=3)
    longest = max(map(len, prompts))
    max_len = longest + args.new_tokens + 6 * args.max_gamma + 16
    sched = make_scheduler(target, rows=(1,), gamma=args.max_gamma, max_len=max_len)
    result = adaptive.sweep(
        sched, drafts, prompts, rtts_ms=rtts, max_gamma=args.max_gamma,
        new_tokens=args.new_tokens,
    )  # fmt: skip
    words = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python tools/bench_adaptive.py", *words])
    result |= {
        "command": command,
        "max_gamma": args.max_gamma,
        "new_tokens": args.new_tokens,
        "prompts": len(prompts),
        "cpus": os.cpu_count(),
        "load_average_1min_end": os.getloadavg()[0],
    }
    md = markdown(result)
    print(md)
    if args.out is not None:
        bench = write_tool_section(pathlib.Path(args.out), "adaptive", result, md)
        try:
            adaptive.plot(result, args.max_gamma, bench / "adaptive.png")
        except ModuleNotFoundError as e:  # matplotlib: the test extra
            print(f"note: no plot ({e.name} is not installed)")
        print(f"wrote {bench}/adaptive.{{json,md,png}} and BENCHMARKS.md's section")
    if result["failures"]:
        print(f"FAILED: {result['failures']}", file=sys.stderr)
    return 1 if result["failures"] else 0


def markdown(r: dict[str, object]) -> str:
    lines = [
        "## Adaptive gamma",
        "",
        f"Produced by `{r['command']}` on {r['cpus']} CPUs (load average "
        f"{r['load_average_1min_end']:.1f} at the end). Pipelined edge-cloud decoding, greedy, "
        f"batch 1, {r['prompts']} held-out prompts × {r['new_tokens']} tokens, through an "
        "in-process verifier behind a simulated link; ms per token (wall time over tokens, the "
        'first round trip included) for each fixed γ and for `gamma="auto"` (the edge picks '
        "each block's length from measured acceptance per position, draft time and answer "
        "latency by the papers' model, `edge.adaptive`). Every auto run's tokens equal the "
        "fixed runs' token for token"
        + (" (checked)." if not r["failures"] else f" — **NOT: {r['failures']}**."),
        "",
        *adaptive.table_md(r, int(r["max_gamma"])),  # type: ignore[arg-type]
        "",
        "![ms per token vs round trip: every fixed gamma, the best of them, and auto]"
        "(bench/adaptive.png)",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
