"""Where the verify step's time goes: one `jax.profiler` trace of a few steps, each XLA op's
time attributed by the op's source (its HLO `op_name`) to the weight matmuls, the tied logits,
attention (the slot gather, scores, softmax, the KV scatter), the rule and the rest.

The shares are what the batch sweep's gap to the roofline is made of: the roofline counts the
weight and live KV bytes (or the FLOPs) once at the machine's measured rates, so a step whose
time is all weight matmuls is as far from it as XLA's matmuls are from that bandwidth.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax

CATEGORIES = (
    ("logits", r"bte,ve->btv|lm_head|attend"),
    # XLA's dot_general, or the float kernel's custom call (jaxspec.kernels) in its scope
    ("weight matmuls", r"(q|k|v|o|gate|up|down)_proj/"),
    ("attention", r"self_attn/"),
    ("rule", r"_verify|warp|sample"),
)


def category(op_name: str) -> str:
    """The part of the step an HLO op's `op_name` belongs to (first match), else "other"."""
    for name, pattern in CATEGORIES:
        if re.search(pattern, op_name):
            return name
    return "other"


def op_names(hlo_text: str) -> dict[str, str]:
    """Each HLO instruction's name -> its `op_name` metadata (the JAX source op)."""
    pairs = re.finditer(r"%([\w.\-]+) = [^\n]*?metadata=\{op_name=\"([^\"]+)\"", hlo_text)
    return {m.group(1): m.group(2) for m in pairs}


def shares(run: Callable[[], Any], hlo_text: str, steps: int = 3) -> dict[str, Any]:
    """Trace `steps` calls of `run` (one step each, results blocked on) and sum each op's time
    by `category`. Returns seconds per step by category, their fractions, and the op time's
    share of the traced wall time (the rest: dispatch, host work, idle threads)."""
    names = op_names(hlo_text)
    run()  # compiled and warm
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(steps):
                run()
        (trace,) = pathlib.Path(d).rglob("*.trace.json.gz")
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    by = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("name") in names:
            by[category(names[e["name"]])] += e["dur"] * 1e-6 / steps
    total = sum(by.values())
    return {
        "seconds": dict(by),
        "fractions": {k: v / total for k, v in by.items()} if total else {},
        "op_seconds": total,
    }
