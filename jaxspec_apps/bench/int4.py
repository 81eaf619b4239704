"""The `int4` section (real pair's shapes, run only when named: `jaxspec bench --pairs real
--sections int4`): the int4 FFI kernel (jaxspec.kernels.int4) against XLA's paths on a
SmolLM2-shaped decode stack.

The stack: 30 layers of q [576->576], k, v [576->192], o [576->576], gate, up [576->1536], down
[1536->576], then the tied head [576->49152], chained as a decode step is (RMS-normalised
residual; k and v feed the residual with a small weight so nothing is dead code). Random
weights, `int4_group` rows per scale (`int4_offset`: a per-group offset too). Four variants,
timed alternating in one run at each of `int4_rows` rows (median of `int4_repeats` after a
warm-up):

    f32 dense     jnp.matmul on float32 weights
    bf16 dense    jnp.matmul on bfloat16 weights (activations cast to bf16)
    XLA W4A16     int4kernel.reference_matmul on the checkpoint layout under jit
                  (XLA rebuilds the float weight before each dot)
    int4 kernel   int4kernel.matmul (the FFI custom call) on the prepared layout

"of roofline" = (weight bytes the variant must read / time) / read bandwidth, the bandwidth
measured in the same run (`common.measure_roofline`). Weight bytes: 4 or 2 per parameter for
the dense variants, 1/2 per parameter plus the bf16 scales (and offsets) for the int4 ones.
Asserts nothing about timings; skipped where the kernel is not built.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import kernels
from jaxspec.kernels import int4 as int4kernel
from jaxspec.kernels.int4_layout import pack_tiles, unpack_int4
from jaxspec_apps.bench.common import measure_roofline
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (the int4 kernel against XLA's paths).
Config = sizes("int4_", rows=(1, 5, 16), group=64, offset=False, repeats=7)


QUICK_SIZES = Config(rows=(1,), repeats=1)

HIDDEN, KV, FFN, VOCAB, LAYERS = 576, 192, 1536, 49152, 30
LAYER = {
    "q": (HIDDEN, HIDDEN),
    "k": (HIDDEN, KV),
    "v": (HIDDEN, KV),
    "o": (HIDDEN, HIDDEN),
    "gate": (HIDDEN, FFN),
    "up": (HIDDEN, FFN),
    "down": (FFN, HIDDEN),
}


def shapes(layers: int) -> list[tuple[str, int, int]]:
    """(name, K, M) of every matmul of the stack: `layers` layers, then the head."""
    out = [(f"{i}.{n}", K, M) for i in range(layers) for n, (K, M) in LAYER.items()]
    return [*out, ("head", HIDDEN, VOCAB)]


def step(mm: Callable[[jax.Array, str], jax.Array], x: jax.Array) -> jax.Array:
    """One decode step over the stack; `mm(h, name)` is the variant's matmul."""
    h = x
    for i in range(LAYERS):
        q, k, v = mm(h, f"{i}.q"), mm(h, f"{i}.k"), mm(h, f"{i}.v")
        kv = jnp.sum(k, axis=-1, keepdims=True) + jnp.sum(v, axis=-1, keepdims=True)
        a = h + mm(q, f"{i}.o") + 1e-6 * kv
        a = a * jax.lax.rsqrt(jnp.mean(a * a, axis=-1, keepdims=True) + 1e-6)
        f = mm(jax.nn.silu(mm(a, f"{i}.gate")) * mm(a, f"{i}.up"), f"{i}.down")
        h = a + f
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    return mm(h, "head")


def per_row(a: Any, group: int, K: int) -> np.ndarray:
    """[G, M] per-group values -> float32 [K, M]."""
    return np.repeat(np.asarray(a, np.float32), group, axis=0)[:K]


def build(group: int, offset: bool) -> tuple[dict[str, Any], dict[str, int]]:
    """variant -> (jitted step(weights, x), weights); variant -> bytes of weights read. Random
    int4 weights, `group` rows per scale, with a per-group offset when `offset`."""
    rng = np.random.default_rng(0)
    f32, bf16, ck, prep = {}, {}, {}, {}
    wbytes = {"f32 dense": 0, "bf16 dense": 0, "XLA W4A16": 0, "int4 kernel": 0}
    for name, K, M in shapes(LAYERS):
        G = -(-K // group)
        packed = rng.integers(0, 256, size=(-(-K // 2), M), dtype=np.uint8)
        scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(G, M)) / (8 * np.sqrt(K)), jnp.bfloat16)
        off = jnp.asarray(rng.normal(0, 1e-3, size=(G, M)), jnp.bfloat16) if offset else None
        dense = per_row(scale, group, K) * unpack_int4(packed, K)
        if off is not None:
            dense += per_row(off, group, K)
        dense = jnp.asarray(dense)
        f32[name] = dense
        bf16[name] = dense.astype(jnp.bfloat16)
        ck[name] = (jnp.asarray(packed), scale, off)
        prep[name] = (jnp.asarray(pack_tiles(unpack_int4(packed, K))), scale, off)
        q_bytes = packed.nbytes + scale.nbytes * (2 if off is not None else 1)
        wbytes["f32 dense"] += K * M * 4
        wbytes["bf16 dense"] += K * M * 2
        wbytes["XLA W4A16"] += q_bytes
        wbytes["int4 kernel"] += q_bytes
    dims = {name: (K, M) for name, K, M in shapes(LAYERS)}
    g = group

    def dense_step(w: dict[str, Any], x: jax.Array) -> jax.Array:
        return step(lambda h, n: jnp.matmul(h.astype(w[n].dtype), w[n]).astype(jnp.float32), x)

    def xla_w4(w: dict[str, Any], x: jax.Array) -> jax.Array:
        def mm(h: jax.Array, n: str) -> jax.Array:
            K, M = dims[n]
            return int4kernel.reference_matmul(h, *w[n], K=K, M=M, group=g)

        return step(mm, x)

    def kernel(w: dict[str, Any], x: jax.Array) -> jax.Array:
        def mm(h: jax.Array, n: str) -> jax.Array:
            K, M = dims[n]
            return int4kernel.matmul(h, *w[n], K=K, M=M, group=g)

        return step(mm, x)

    variants = {
        "f32 dense": (jax.jit(dense_step), f32),
        "bf16 dense": (jax.jit(dense_step), bf16),
        "XLA W4A16": (jax.jit(xla_w4), ck),
        "int4 kernel": (jax.jit(kernel), prep),
    }
    return variants, wbytes


def time_rows(
    variants: dict[str, Any], wbytes: dict[str, int], rows: int, repeats: int, bw: float
) -> list[dict[str, Any]]:
    """One row per variant at `rows` rows: median ms per step and fraction of the roofline."""
    x = jnp.asarray(np.random.default_rng(rows).normal(size=(rows, HIDDEN)), jnp.float32)
    for fn, w in variants.values():  # compile and warm up
        fn(w, x).block_until_ready()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (fn, w) in variants.items():
            t = time.perf_counter()
            fn(w, x).block_until_ready()
            times[name].append(time.perf_counter() - t)
    out = []
    for name, ts in times.items():
        t = statistics.median(ts)
        out.append({"rows": rows, "variant": name, "ms": t * 1e3,
                    "roofline_fraction": wbytes[name] / t / bw})  # fmt: skip
    return out


def run_section(ctx: Context) -> dict[str, Any]:
    """Every variant at every row count of the profile."""
    p = ctx.p
    if not kernels.available():
        return {"skipped": f"the int4 kernel is not built ({kernels.status()})"}
    variants, wbytes = build(p.int4.group, p.int4.offset)
    bw = measure_roofline(p.roofline_mib, p.roofline_n)["bandwidth_Bps"]
    rows = [r for n in p.int4.rows for r in time_rows(variants, wbytes, n, p.int4.repeats, bw)]
    return {
        "command": ctx.command,
        "status": kernels.status(),
        "group": p.int4.group,
        "offset": p.int4.offset,
        "repeats": p.int4.repeats,
        "bandwidth_Bps": bw,
        "weight_bytes": wbytes,
        "rows": rows,
    }


SECTION = Section("int4", run_section)
