"""An int8 x float32 matmul for XLA:CPU (csrc/body_int8.inc), as an FFI call: the head of a
W4A16 model kept at 8 bits on a symmetric grid per group of k (GGUF's Q8_0: int8 q, one scale
per 32 values of k), read as int8 and never widened to a float table.

    y = matmul(x, q, scale, group=32)     # x f32[..., K]; q int8 [K, M]; scale [ceil(K/g), M]

Semantics (float32): W[k, m] = scale[k // group, m] * q[k, m], y = x @ W, summed per group
(an fma chain over the group's k) and folded with the group's scale; the order depends on K
and the group alone, so a row's output does not depend on the rows beside it, and every
instruction set gives the same bits.

Pure module: imports only jax, numpy and `jaxspec.kernels`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxspec import kernels

TARGET = "jaxspec_int8_matmul"
_SCALE_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def _check(q, scale, K: int, group: int) -> None:
    if q.ndim != 2 or jnp.dtype(q.dtype) != jnp.dtype(jnp.int8) or q.shape[0] != K:
        raise ValueError(f"q must be int8 [K={K}, M], got {q.dtype}{list(q.shape)}")
    G = -(-K // group)
    if tuple(scale.shape) != (G, q.shape[1]) or jnp.dtype(scale.dtype) not in _SCALE_DTYPES:
        raise ValueError(
            f"scale must be bf16/f16/f32 [G={G}, M={q.shape[1]}], "
            f"got {scale.dtype}{list(scale.shape)}"
        )


@functools.cache
def _call(N: int, M: int):
    return jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct((N, M), jnp.float32), vmap_method="sequential"
    )


def matmul(
    x: Float[Array, "... K"], q: jax.Array, scale: jax.Array, *, group: int
) -> Float[Array, "... M"]:
    """x f32[..., K] @ (scale * q) -> f32[..., M] on the kernel (XLA:CPU only)."""
    if not kernels.available():
        raise RuntimeError(kernels.status())
    q, scale = jnp.asarray(q), jnp.asarray(scale)
    K = x.shape[-1]
    _check(q, scale, K, group)
    x2 = jnp.asarray(x, jnp.float32).reshape(-1, K)
    out = _call(x2.shape[0], q.shape[1])(x2, q, scale, group=np.int64(group))
    return out.reshape((*x.shape[:-1], q.shape[1]))


def reference_matmul(x, q, scale, *, group: int) -> jax.Array:
    """The same product in XLA's ops (dequantize, dot): for tests."""
    q, scale = jnp.asarray(q), jnp.asarray(scale)
    K = q.shape[0]
    _check(q, scale, K, group)
    w = jnp.repeat(scale.astype(jnp.float32), group, axis=0)[:K] * q.astype(jnp.float32)
    return jnp.matmul(jnp.asarray(x, jnp.float32), w, precision=jax.lax.Precision.HIGHEST)
