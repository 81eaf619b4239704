"""Inter-token latency over a simulated WAN: cloud autoregressive, co-located speculative,
sync edge-cloud and pipelined edge-cloud decoding, measured next to the papers' model.

    python tools/bench_latency.py --out bench/latency          # the shipped default pair
    python tools/bench_latency.py --tiny --out /tmp/lat         # seconds (CI)

Everything runs in this process on this machine: the edge drafter (`edge.Drafter`), the
verifier (`verify.LocalVerifier`) behind `edge.DelayedEndpoint` (one-way delay RTT/2 each
way, FIFO). t_d (draft time per token), t_v (one verify step) and t_ar (one target decode
step) are measured first, alpha from co-located speculative decoding of the same prompt; the
predictions are the papers' model (`jaxspec.analytic`, held equal to `proofs.latency`)
evaluated at those numbers. Cloud autoregressive decoding and co-located speculative decoding
stream tokens the cloud computes, so their inter-token latency is their measured compute time
per token (the RTT delays only the first token). Writes `<out>.md`, `<out>.json` and
`<out>.png`. The code is `jaxspec_apps.bench.latency`, which `jaxspec bench` also runs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

import jaxspec
from jaxspec_apps.bench import latency
from jaxspec_host.flags import add_draft_flags, add_sampling_flags

RTTS_MS = (0, 5, 20, 50, 100, 200)


def write_report(out: pathlib.Path, comp, rows, gamma: int, argv: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(latency.table_md(comp, rows, gamma))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "argv": argv,
                "components": comp,
                "rows": rows,
                "crossover_ms_measured": latency.crossover_ms(rows, "measured"),
                "crossover_ms_predicted": latency.predicted_crossover_ms(comp, gamma),
            },
            indent=2,
        )
    )
    latency.plot(rows, out.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="default")
    p.add_argument("--draft", default="default-draft")
    p.add_argument("--tiny", action="store_true")
    add_draft_flags(p, mode=None, encoding=None, sparse_k=None)  # every mode; onehot/full q
    p.add_argument("--new-tokens", type=int, default=48)
    add_sampling_flags(
        p, temperature=0.0, top_k=None, top_p=None, seed=None, min_p=None, logit_bias=None
    )
    p.add_argument("--rtts", default=",".join(map(str, RTTS_MS)))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True, help="writes <out>.md, <out>.json, <out>.png")
    a = p.parse_args(argv)
    if a.tiny:
        from jaxspec.testing import tiny_config

        cfg = tiny_config()
        target = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
        draft = target.with_params(jax.tree.map(lambda x: x * 1.02, target.params))
        prompt = [1, 2, 3, 4]
        a.new_tokens, a.repeats, a.rtts = 8, 1, "0,20"
    else:
        target, draft = jaxspec.load(a.target), jaxspec.load(a.draft)
        import inspect
        import json as json_mod

        text = inspect.getsource(json_mod)
        prompt = target.tokenizer.encode(text[:400], add_special_tokens=False)[:48]
    comp, rows = latency.run(
        target,
        draft,
        gamma=a.gamma,
        new_tokens=a.new_tokens,
        temperature=a.temperature,
        rtts_ms=[int(r) for r in a.rtts.split(",")],
        repeats=a.repeats,
        prompt=prompt,
    )
    out = pathlib.Path(a.out)
    write_report(out, comp, rows, a.gamma, sys.argv[1:] if argv is None else argv)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
