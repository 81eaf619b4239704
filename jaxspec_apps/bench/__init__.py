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

from jaxspec_apps.bench.command import add_arguments, main

__all__ = ["add_arguments", "main"]
