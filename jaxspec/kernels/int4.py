"""An int4 x float32 matmul for XLA:CPU (W4A16 decode), as an XLA FFI custom call.

XLA:CPU rebuilds the float weight from int4 before each dot, which makes a W4A16 decode step
slower than float32. `matmul` instead calls a kernel (csrc/body_int4.inc, in the library of
`jaxspec.kernels`) that sums nibbles in registers and never writes a float weight. One row and
many rows run the same operations per output, so a row's result does not depend on the rows
beside it (batch invariance, as the float kernel).

    w = int4_layout.pack_tiles(q)                # once, at load time, outside jit
    y = matmul(x, w, scale, offset, K=K, M=M, group=group)   # under jit

Semantics (float32 accumulate), with q the int4 values of the checkpoint:
    W[k, m] = f32(scale[k // group, m]) * q[k, m] + (f32(offset[k // group, m]) or 0)
    result  = x @ W

Layouts (`jaxspec.kernels.int4_layout`, written once): the kernel reads the tiled layout of
`pack_tiles`, uint8 [ceil(M/64), K, 32]; `reference_matmul` reads the rows layout of
`pack_int4`, uint8 [ceil(K/2), M].

Threads and instruction set: `jaxspec.kernels` (one control for every kernel).

Pure module: imports only jax, numpy, the standard library and `jaxspec.kernels`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import kernels
from jaxspec.kernels.int4_layout import TILE, unpack_int4

TARGET = "jaxspec_int4_matmul"
_SCALE_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def _check(scale, offset, K: int, M: int, group: int) -> None:
    G = -(-K // group)
    if tuple(scale.shape) != (G, M):
        raise ValueError(f"scale must be [G={G}, M={M}], got {tuple(scale.shape)}")
    if scale.dtype not in _SCALE_DTYPES:
        raise ValueError(f"scale dtype must be bfloat16, float16 or float32, got {scale.dtype}")
    if offset is not None:
        if tuple(offset.shape) != (G, M):
            raise ValueError(f"offset must be [G={G}, M={M}], got {tuple(offset.shape)}")
        if offset.dtype not in _SCALE_DTYPES:
            raise ValueError(f"offset dtype must be bf16, f16 or f32, got {offset.dtype}")


@functools.cache
def _call(N: int, M: int):
    return jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct((N, M), jnp.float32), vmap_method="sequential"
    )


def matmul(
    x_NK, w_prepared, scale, offset=None, *, K: int, M: int, group: int, minimum=None
) -> jax.Array:
    """x f32[N, K] (or [..., K]) @ the int4 weight -> f32[N, M] (or [..., M]).

    `w_prepared` is the tiled layout (`int4_layout.pack_tiles`); scale and offset are
    [ceil(K/group), M] in bfloat16, float16 or float32 (offset may be None). `minimum`
    instead of `offset`: the asymmetric grid as stored, W = scale * (q + 8) + minimum (no
    float32 offset is built per call).
    Usable under jax.jit and in Flax modules; the custom call is registered for XLA:CPU only
    (arrays on another backend fail to compile)."""
    if not kernels.available():
        raise RuntimeError(kernels.status())
    if offset is not None and minimum is not None:
        raise ValueError("give an offset or a minimum, not both")
    x = jnp.asarray(x_NK, jnp.float32)
    scale = jnp.asarray(scale)
    mode = 0 if offset is None and minimum is None else (1 if minimum is None else 2)
    offset = None if mode == 0 else jnp.asarray(offset if minimum is None else minimum)
    _check(scale, offset, K, M, group)
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., K={K}], got {x.shape}")
    T = -(-M // TILE)
    if tuple(w_prepared.shape) != (T, K, 32):
        raise ValueError(f"w_prepared must be [{T}, {K}, 32] (pack_tiles), got {w_prepared.shape}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    out = _call(x2.shape[0], M)(
        x2,
        jnp.asarray(w_prepared, jnp.uint8),
        scale,
        scale if offset is None else offset,
        K=np.int64(K),
        M=np.int64(M),
        group=np.int64(group),
        has_offset=np.int64(mode),
    )
    return out.reshape((*lead, M))


def reference_matmul(
    x_NK, qweight, scale, offset=None, *, K: int, M: int, group: int, minimum=None
) -> jax.Array:
    """Pure-JAX `matmul` on the rows layout (`int4_layout.pack_int4`): unpack, dequantize,
    dot; for tests and as the XLA path."""
    if minimum is not None:  # scale * (q + 8) + minimum = scale * q + (minimum + 8 * scale)
        offset = jnp.asarray(minimum, jnp.float32) + 8 * jnp.asarray(scale, jnp.float32)
    x = jnp.asarray(x_NK, jnp.float32)
    scale = jnp.asarray(scale)
    offset = None if offset is None else jnp.asarray(offset)
    _check(scale, offset, K, M, group)
    q = unpack_int4(jnp.asarray(qweight, jnp.uint8), K).astype(jnp.float32)
    w = jnp.repeat(scale.astype(jnp.float32), group, axis=0)[:K] * q
    if offset is not None:
        w = w + jnp.repeat(offset.astype(jnp.float32), group, axis=0)[:K]
    return jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST)
