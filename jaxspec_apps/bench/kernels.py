"""The `kernels` section: the float kernel (jaxspec.kernels.dense) against XLA's own ops, in turns
within one run.

Two tables. The matmul microbenchmark: one jitted chain of 30 SmolLM2-sized weight matmuls
(576 -> 1536 as a Dense kernel [K, M]; 1536 -> 576 against a stored [M, K] table, as the tied
head reads it) at 1, 2, 5, 8 and 16 rows, float32 and bfloat16 weights, GB/s of weight read.
The model: the target's whole forward (`Model.kernels` on and off) at decode (1 x 1), verify
blocks (1, 4 and 16 rows of gamma + 1 = 5 positions) and a 64-token prefill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import kernels
from jaxspec.kernels import dense as floatkernel
from jaxspec_apps.bench.section import Context, Section

ROWS = (1, 2, 5, 8, 16)
SHAPES = ((1, 1), (1, 5), (4, 5), (16, 5), (1, 64))  # (rows, positions) of a model call
CHAIN, K, M = 30, 576, 1536


def _in_turns(a: Callable[[], Any], b: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Best wall times of `a` and `b`, called in turns `repeats` times after a warm-up each."""
    jax.block_until_ready(a())
    jax.block_until_ready(b())
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, fn in enumerate((a, b)):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            best[i] = min(best[i], time.perf_counter() - t)
    return best[0], best[1]


def _chain(kernel: bool, transpose: bool) -> Callable:
    def one(x, w):
        if kernel:
            return floatkernel.matmul(x, w, transpose_w=transpose)
        spec = "nk,mk->nm" if transpose else "nk,km->nm"
        return jnp.einsum(spec, x, w.astype(jnp.float32))

    return jax.jit(lambda x, ws: sum(one(x, w).sum() for w in ws))


def matmul_rows(repeats: int, chain: int = CHAIN) -> list[dict[str, Any]]:
    """Kernel and XLA time per chain, per (weight dtype, layout, rows), timed in turns."""
    rng = np.random.default_rng(0)
    out = []
    for dtype in ("float32", "bfloat16"):
        for transpose in (False, True):
            shape = (K, M)  # NN: x [n, 576] @ [576, 1536]; NT: x [n, 1536] . [576, 1536]
            ws = [jnp.asarray(0.03 * rng.standard_normal(shape), dtype) for _ in range(chain)]
            width = M if transpose else K
            fk, fx = _chain(True, transpose), _chain(False, transpose)
            weight_bytes = sum(w.nbytes for w in ws)
            for n in ROWS:
                x = jnp.asarray(rng.standard_normal((n, width)), jnp.float32)
                tk, tx = _in_turns(partial(fk, x, ws), partial(fx, x, ws), repeats)
                out.append({
                    "dtype": dtype, "layout": "NT (table)" if transpose else "NN (Dense)",
                    "rows": n, "kernel_ms": 1e3 * tk, "xla_ms": 1e3 * tx,
                    "kernel_gb_s": weight_bytes / tk / 1e9, "xla_gb_s": weight_bytes / tx / 1e9,
                })  # fmt: skip
    return out


def model_rows(target: Any, repeats: int, slot: int = 256) -> list[dict[str, Any]]:
    """The target's forward per (rows, positions), kernels on and off, timed in turns."""
    rng = np.random.default_rng(1)
    plain = target.with_params(target.params, kernels=False)
    out = []
    for B, T in SHAPES:
        tokens = jnp.asarray(rng.integers(0, target.config.vocab_size, (B, T)), jnp.int32)
        pos = jnp.asarray(np.tile(np.arange(100, 100 + T), (B, 1)), jnp.int32)
        calls = [partial(m, tokens, pos, m.init_cache(B, slot)) for m in (target, plain)]
        tk, tx = _in_turns(*calls, repeats)
        out.append({
            "rows": B, "positions": T, "kernel_ms": 1e3 * tk, "xla_ms": 1e3 * tx,
            "xla_over_kernel": tx / tk,
        })  # fmt: skip
    decode = out[0]["kernel_ms"]
    for row in out:
        row["over_kernel_decode"] = row["kernel_ms"] / decode
    return out


def run(target: Any, repeats: int, chain: int = CHAIN) -> dict[str, Any]:
    """The section's results (`real.sections.kernels`); `chain` matmuls per timed call."""
    if not kernels.available():
        return {"skipped": kernels.status()}
    return {
        "path": kernels.isa(),
        "chain": chain,
        "matmul": matmul_rows(repeats, chain),
        "model": model_rows(target, repeats),
        "threads": "XLA's CPU pool",
    }


def run_section(ctx: Context) -> dict[str, Any]:
    """Both tables on the pass's target, the best of at least 3 repeats."""
    return run(ctx.target, max(ctx.p.repeats, 3))


SECTION = Section("kernels", run_section)
