"""Exact, plain-Python proofs that jaxspec's speculative decoding is lossless.

An independent second implementation (docs/design.md §1): it imports nothing from the project and
no numerics library, only `fractions.Fraction`. The JAX code is tested against it.

- `proofs.warp`: temperature / top-k / top-p warping and the draft encodings, exact.
- `proofs.rule`: the verification rule of docs/design.md §3 (`accept_prob`, `residual`,
  `sample`, `decide`), written to be compared step by step with the float code.
- `proofs.enumerate`: exact enumeration of sync and pipelined decoding's output law.
- `proofs.variants`: the correct rule and named mutants the proof must reject.
- `proofs.latency`: the papers' analytical latency / capacity model.
- `python -m proofs`: run every proof and report (see `proofs.check`).
"""

from __future__ import annotations

from proofs.enumerate import (
    ENCODINGS,
    MODES,
    Params,
    Spec,
    law_difference,
    mean_length,
    round_law,
    speculative_law,
    target_law,
)
from proofs.rule import accept_prob, accepts, decide, greedy_decide, residual, sample
from proofs.variants import CONTROLS, CORRECT, MUTANTS, Variant, variant_decide
from proofs.warp import argmax, onehot, sparse_topk  # not `warp`: it would shadow the module

__all__ = [
    "CONTROLS",
    "CORRECT",
    "ENCODINGS",
    "MODES",
    "MUTANTS",
    "Params",
    "Spec",
    "Variant",
    "accept_prob",
    "accepts",
    "argmax",
    "decide",
    "greedy_decide",
    "law_difference",
    "mean_length",
    "onehot",
    "residual",
    "round_law",
    "sample",
    "sparse_topk",
    "speculative_law",
    "target_law",
    "variant_decide",
]
