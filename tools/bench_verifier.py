"""Multi-tenant verify step: verified tokens/s vs batch size, against this machine's roofline.

    python tools/bench_verifier.py --checkpoint default          # the shipped target
    python tools/bench_verifier.py --tiny                        # seconds (CI)

For each batch size B (sessions verified in one step, each a block of gamma drafts), opens B
sessions on one `Scheduler`, warms the step up, then times `tick()`s. Prints verified
positions per second (B * (gamma + 1) / step time) as a ratio to B = 1, and the step time
next to the roofline bound measured in the same run: max(weight bytes / measured read
bandwidth, FLOPs / measured matmul throughput). The code is `jaxspec_apps.bench.verifier`, which
`jaxspec bench` runs in its report.
"""

from __future__ import annotations

import argparse
import json
import sys

import jaxspec
from jaxspec_apps.bench.verifier import batch_sweep
from jaxspec_host.flags import add_draft_flags


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="default")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batches", default="1,2,4,8,16,32,64")
    add_draft_flags(p, mode=None, encoding=None, sparse_k=None)  # onehot blocks
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.tiny:
        from jaxspec.testing import tiny_config

        cfg = tiny_config()
        model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        a.batches, a.steps, a.prompt_len = "1,2,4", 2, 8
    else:
        model = jaxspec.load(a.checkpoint)
    out = batch_sweep(model, [int(b) for b in a.batches.split(",")], a.gamma, a.prompt_len, a.steps)
    roof, rows = out[0]["roofline"], out[1:]
    print(
        f"machine: read bandwidth {roof['bandwidth_Bps'] / 1e9:.1f} GB/s, "
        f"matmul {roof['flops_per_s'] / 1e9:.0f} GFLOP/s; model {model.num_params():,} params, "
        f"{model.nbytes() / 1e6:.1f} MB; gamma {a.gamma}"
    )
    print(
        f"{'batch':>5} {'step ms':>8} {'verified tok/s':>14} {'vs batch 1':>10} "
        f"{'roofline ms':>11} {'of roofline':>11}"
    )
    for r in rows:
        print(
            f"{r['batch']:>5} {r['step_s'] * 1e3:>8.2f} {r['verified_tok_s']:>14.0f} "
            f"{r['ratio_to_batch1']:>9.2f}x {r['roofline_s'] * 1e3:>11.2f} "
            f"{r['roofline_fraction']:>10.0%}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "results": out}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
