"""Cloud decoding as its user gets it, for the `two_process` section: the target's plain decode
loop on the verifier's core, one compute thread, in a process of its own; it prints its
figures as one JSON line.

    python -m jaxspec_apps.bench.twoproc_cloud --target smollm2 \
        --chat 'Explain recursion.' --new-tokens 64 --repeats 2 --core 0

A streamed cloud answer costs its user one round trip (the request, then the first token
back) and then the tokens as the loop makes them: the time per token after that first round
trip is the loop's whole time (prefill included, `jaxspec.generate`'s `wall_s`: compilation
excluded) over the tokens, whatever the round trip. The best of `repeats` after a warm-up; the
tokens (T = 0) are printed for the section to check against the edge sessions'. Pinned as
`twoproc_edge.pin` pins the edge: every thread of the process on `core`, before JAX starts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import jaxspec
from jaxspec.quant.calibration import prompt_ids
from jaxspec_apps.bench.twoproc_edge import pin


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--chat", required=True, help="the user message (the target's chat template)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--core", type=int, default=None)
    args = p.parse_args(argv)
    cores = pin(args.core)  # before JAX starts its threads (at its first array)
    target = jaxspec.load(args.target)
    prompt = list(prompt_ids(target, args.chat))

    def run() -> jaxspec.GenerateOutput:
        return jaxspec.generate(target, prompt, args.new_tokens, temperature=0.0)

    run()  # compiles
    outs = [run() for _ in range(args.repeats)]
    best = min(o.stats.wall_s / len(o.tokens) for o in outs)
    print(json.dumps({"s_per_token": best, "tokens": outs[0].tokens, "cores": cores}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
