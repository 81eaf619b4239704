"""Compile time and run time of three SmolLM2 verifier shapes, under whatever XLA_FLAGS the
environment sets (a fresh compilation cache each run), e.g.

    python tools/compile_vs_step.py
    XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" \\
        python tools/compile_vs_step.py

docs/testing.md quotes it: the test suite's flags compile faster and step slower."""

from __future__ import annotations

import os
import tempfile
import time

os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-vs-step-")

import jax
import numpy as np

import jaxspec
from verify import LocalVerifier, SchedulerConfig

SHAPES = [("step", 1, 5, 256), ("step", 16, 5, 512), ("prefill", 1, 64, 512)]


def main() -> None:
    target = jaxspec.load("smollm2")
    sched = LocalVerifier(target, SchedulerConfig(max_gamma=4, max_sessions=16, max_len=512))
    sched = sched.scheduler
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    for shape in SHAPES:
        fn, abstract = sched.precompile_args(shape)
        t0 = time.monotonic()
        compiled = fn.lower(*abstract).compile()
        compile_s = time.monotonic() - t0
        kind, R, W, A = shape
        rest = abstract[2:]  # the batch (or the prefill's inputs) is concrete, all zeros
        times = []
        for _ in range(12):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(sched.params, sched.cache, *rest))
            times.append(time.perf_counter() - t0)
            sched.cache = out[0] if kind == "step" else out
        ms = 1000 * np.median(times[2:])
        print(f"{kind} {R}x{W} over {A}: compile {compile_s:.2f} s, run median {ms:.1f} ms")


if __name__ == "__main__":
    main()
