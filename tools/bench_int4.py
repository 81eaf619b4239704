"""The int4 FFI kernel (jaxspec.int4kernel) against XLA's paths on a SmolLM2-shaped decode stack:

    python tools/bench_int4.py                 # N = 1, 5, 16 rows; group 64; no offset
    python tools/bench_int4.py --rows 1 --repeats 5 --offset

The stack: 30 layers of q [576->576], k, v [576->192], o [576->576], gate, up [576->1536], down
[1536->576], then the tied head [576->49152], chained as a decode step is (RMS-normalised
residual; k and v feed the residual with a small weight so nothing is dead code). Random
weights. Four variants, timed alternating in one run (median of `--repeats` after a warm-up):

    f32 dense     jnp.matmul on float32 weights
    bf16 dense    jnp.matmul on bfloat16 weights (activations cast to bf16)
    XLA W4A16     int4kernel.reference_matmul on the checkpoint layout under jit
                  (XLA rebuilds the float weight before each dot)
    int4 kernel   int4kernel.matmul (the FFI custom call) on the prepared layout

"roofline" = (weight bytes the variant must read / time) / read bandwidth, the bandwidth
measured in the same run by a jitted sum over 256 MiB. Weight bytes: 4 or 2 per parameter for
the dense variants, 1/2 per parameter plus the bf16 scales (and offsets) for the int4 ones.
Prints; asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import int4kernel

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
    out = [(f"{i}.{n}", K, M) for i in range(layers) for n, (K, M) in LAYER.items()]
    return [*out, ("head", HIDDEN, VOCAB)]


def step(mm, x):
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


def per_row(a, group: int, K: int) -> np.ndarray:
    """[G, M] per-group values -> float32 [K, M]."""
    return np.repeat(np.asarray(a, np.float32), group, axis=0)[:K]


def build(args) -> tuple[dict, dict]:
    """variant -> (jitted step(weights, x), weights); variant -> bytes of weights read."""
    rng = np.random.default_rng(0)
    f32, bf16, ck, prep = {}, {}, {}, {}
    wbytes = {"f32 dense": 0, "bf16 dense": 0, "XLA W4A16": 0, "int4 kernel": 0}
    for name, K, M in shapes(LAYERS):
        G = -(-K // args.group)
        packed = rng.integers(0, 256, size=(-(-K // 2), M), dtype=np.uint8)
        scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(G, M)) / (8 * np.sqrt(K)), jnp.bfloat16)
        offset = (
            jnp.asarray(rng.normal(0, 1e-3, size=(G, M)), jnp.bfloat16) if args.offset else None
        )
        dense = per_row(scale, args.group, K) * int4kernel.unpack_checkpoint(packed, K)
        if offset is not None:
            dense += per_row(offset, args.group, K)
        dense = jnp.asarray(dense)
        f32[name] = dense
        bf16[name] = dense.astype(jnp.bfloat16)
        ck[name] = (jnp.asarray(packed), scale, offset)
        prep[name] = (jnp.asarray(int4kernel.prepare(packed, K)), scale, offset)
        q_bytes = packed.nbytes + scale.nbytes * (2 if offset is not None else 1)
        wbytes["f32 dense"] += K * M * 4
        wbytes["bf16 dense"] += K * M * 2
        wbytes["XLA W4A16"] += q_bytes
        wbytes["int4 kernel"] += q_bytes
    dims = {name: (K, M) for name, K, M in shapes(LAYERS)}
    g = args.group

    def dense_step(w, x):
        return step(lambda h, n: jnp.matmul(h.astype(w[n].dtype), w[n]).astype(jnp.float32), x)

    def xla_w4(w, x):
        def mm(h, n):
            K, M = dims[n]
            return int4kernel.reference_matmul(h, *w[n], K=K, M=M, group=g)

        return step(mm, x)

    def kernel(w, x):
        def mm(h, n):
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


def bandwidth() -> float:
    x = jnp.ones((256 * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        total(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5, 16])
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--offset", action="store_true", help="int4 with a per-group offset too")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(int4kernel.status())
    if not int4kernel.available():
        raise SystemExit("the kernel is not built: nothing to compare")
    variants, wbytes = build(args)
    bw = bandwidth()
    print(f"read bandwidth: {bw / 1e9:.1f} GB/s (jitted sum over 256 MiB)")
    print(
        f"group {args.group}, offset {'yes' if args.offset else 'no'}; weight MB read per step: "
        + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in wbytes.items())
    )
    print(f"{'N':>3}  {'variant':<12} {'ms/step':>9} {'roofline':>9}")
    for N in args.rows:
        x = jnp.asarray(np.random.default_rng(N).normal(size=(N, HIDDEN)), jnp.float32)
        for fn, w in variants.values():  # compile and warm up
            fn(w, x).block_until_ready()
        times = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, (fn, w) in variants.items():
                t = time.perf_counter()
                fn(w, x).block_until_ready()
                times[name].append(time.perf_counter() - t)
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"{N:>3}  {name:<12} {t * 1e3:9.2f} {wbytes[name] / t / bw:9.2f}")


if __name__ == "__main__":
    main()
