"""Grouped-query attention over a KV cache: the batch-invariant CPU kernel
(csrc/body_attention.inc) and its XLA form.

`attention` runs on the kernel, and `cache_attention` too, reading the model's stacked cache
in place (no slot's keys copied out per layer): query (b, t) sees cache indices
`s <= positions[b, t]`, and every number is summed in an order fixed by D and the query's
position alone, so a position's output does not depend on T, B or the KV bucket S.
`einsum_attention` is the same attention in XLA's ops: the model's form where the kernel is
not used (accelerators, float64, no library) and the kernel's gradient (a custom JVP).

Pure module: imports only jax, numpy and `jaxspec.kernels`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from jaxspec import kernels

TARGET = "jaxspec_attention"
CACHE_TARGET = "jaxspec_attention_cache"
CACHE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))  # read in place


def _acc(dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def einsum_attention(
    q_BTKGD: Float[Array, "B T K G D"],
    keys_BSKD: Float[Array, "B S K D"],
    vals_BSKD: Float[Array, "B S K D"],
    visible_BTS: Bool[Array, "B T S"],
    dtype=jnp.float32,
) -> Float[Array, "B T K G D"]:
    """Grouped-query attention as two dot_generals (the fast form on accelerators); scores
    and softmax in float32 (float64 for a float64 model), the rest in `dtype`."""
    acc = _acc(dtype)
    scores_BKGTS = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, keys_BSKD.astype(dtype)).astype(
        acc
    ) / np.sqrt(q_BTKGD.shape[-1]).astype(acc)
    scores_BKGTS = jnp.where(visible_BTS[:, None, None], scores_BKGTS, -jnp.inf)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs_BKGTS, vals_BSKD.astype(dtype))


def attention(
    q_BTKGD: Float[Array, "B T K G D"],
    keys_BSKD: Float[Array, "B S K D"],
    vals_BSKD: Float[Array, "B S K D"],
    positions_BT: jax.Array,
) -> Float[Array, "B T K G D"]:
    """Attention on the kernel; float32 in and out. Gradients: `einsum_attention`'s."""
    if not kernels.available():
        raise RuntimeError(kernels.status())
    f32 = jnp.float32
    return _attention(
        q_BTKGD.astype(f32),
        keys_BSKD.astype(f32),
        vals_BSKD.astype(f32),
        jnp.asarray(positions_BT, jnp.int32),
    )


def _kernel(q, k, v, pos):
    call = jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential"
    )
    return call(q, k, v, pos)


def visible(S: int, pos_BT: jax.Array, window: int | None = None) -> Bool[Array, "B T S"]:
    """Which of S cache indices each query sees: those up to its position, and with a sliding
    `window` only the last `window` of them (HF's and llama.cpp's rule: p - window < s <= p)."""
    s = jnp.arange(S)[None, None, :]
    seen = s <= pos_BT[:, :, None]
    return seen if window is None else seen & (s > pos_BT[:, :, None] - window)


def _visible(k, pos, window=None):
    return visible(k.shape[1], pos, window)


@jax.custom_jvp
def _attention(q, k, v, pos):
    return _kernel(q, k, v, pos)


@_attention.defjvp
def _attention_jvp(primals, tangents):
    q, k, v, pos = primals
    dq, dk, dv, _ = tangents
    visible = _visible(k, pos)
    _, tangent = jax.jvp(
        lambda q, k, v: einsum_attention(q, k, v, visible), (q, k, v), (dq, dk, dv)
    )
    return _kernel(q, k, v, pos), tangent


def cache_attention(
    q_BTKGD: Float[Array, "B T K G D"],
    k_all_LNSKD: Float[Array, "L N Smax K D"],
    v_all_LNSKD: Float[Array, "L N Smax K D"],
    layer: int,
    rows_B: jax.Array,
    positions_BT: jax.Array,
    S: int,
    window: int | None = None,
) -> Float[Array, "B T K G D"]:
    """`attention` over `k_all[layer, rows, :S]` read in place from the whole cache, float32
    or bfloat16 (a slice or gather of it, or a float32 copy of a bfloat16 one, would be copied
    for the call). `layer`, `S`, `window` (a sliding window: see `visible`) static; the same
    bits as `attention` on the slices converted to float32. Gradients: `einsum_attention`'s
    on the slices."""
    if not kernels.available():
        raise RuntimeError(kernels.status())
    if k_all_LNSKD.dtype != v_all_LNSKD.dtype or k_all_LNSKD.dtype not in CACHE_DTYPES:
        raise ValueError(
            f"the cache must be float32 or bfloat16 (k and v alike), got "
            f"{k_all_LNSKD.dtype} and {v_all_LNSKD.dtype}"
        )
    return _cache_attention(
        q_BTKGD.astype(jnp.float32), k_all_LNSKD, v_all_LNSKD,
        jnp.asarray(rows_B, jnp.int32), jnp.asarray(positions_BT, jnp.int32), layer, S,
        window or 0,
    )  # fmt: skip


def _cache_kernel(q, k_all, v_all, rows, pos, layer, S, window):
    call = jax.ffi.ffi_call(
        CACHE_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential"
    )
    attrs = {"layer": np.int64(layer), "S": np.int64(S), "window": np.int64(window)}
    return call(q, k_all, v_all, rows, pos, **attrs)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7))
def _cache_attention(q, k_all, v_all, rows, pos, layer, S, window):
    return _cache_kernel(q, k_all, v_all, rows, pos, layer, S, window)


@_cache_attention.defjvp
def _cache_attention_jvp(layer, S, window, primals, tangents):
    q, k_all, v_all, rows, pos = primals
    dq, dk, dv, _, _ = tangents

    def sliced(q, k_all, v_all):
        k, v = k_all[layer, rows, :S], v_all[layer, rows, :S]
        return einsum_attention(q, k, v, _visible(k, pos, window or None))

    _, tangent = jax.jvp(sliced, (q, k_all, v_all), (dq, dk, dv))
    return _cache_kernel(q, k_all, v_all, rows, pos, layer, S, window), tangent
