"""The batch-invariant float matmul for XLA:CPU (csrc/body_float.inc), as an FFI call.

Every dense layer of a float model and its tied head run through `dot_general` / `head`,
which on the CPU call the kernel (`jaxspec.kernels`), and elsewhere (GPU, TPU, float64, no
compiler) are XLA's own dot. The kernel exists for two reasons:

- **Exactness.** It sums every output in one fixed order that depends only on the contracted
  size K, never on the number of rows, their batch mates or the thread: a position's K/V and
  logits are the same bits whether it was computed alone (decode), inside a verify block, or
  inside a long prefill. XLA:CPU's dot changes a row's rounding with the row count (Eigen's
  blocking), which made a resumed session's cache differ from the uninterrupted one by ~1e-6.
- **Bytes.** It reads each weight byte once per call whatever the row count (a verify block
  of 5 rows costs about what one row costs), where XLA:CPU's GEMM packs both operands anew.

    y = matmul(x, w)                    # x f32[..., K] @ w [K, M] (float32 or bfloat16)
    y = matmul(x, table, transpose_w=True)   # x @ table.T, table [M, K] (a tied embedding)

Gradients go through XLA's dot (a custom JVP), so training code keeps working. The kernel is
used when `enabled()`: the library is loaded, the default backend is the CPU, and
`JAXSPEC_FLOAT_KERNEL` is not "0". The choice is made when a function is traced.

Pure module: imports only jax, numpy, the standard library and `jaxspec.kernels`.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxspec import kernels
from jaxspec.compilation import trace_cache

TARGET = "jaxspec_float_matmul"
_W_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def enabled() -> bool:
    """Whether a function traced now runs its float matmuls and attention on the kernels."""
    if os.environ.get("JAXSPEC_FLOAT_KERNEL", "") == "0":
        return False
    return jax.default_backend() == "cpu" and kernels.available()


trace_cache.key_part("float_kernel", lambda: "on" if enabled() else "off")


@functools.cache
def _call(N: int, M: int):
    return jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct((N, M), jnp.float32), vmap_method="sequential"
    )


def _kernel(x: jax.Array, w: jax.Array, transpose_w: bool) -> jax.Array:
    K = x.shape[-1]
    M = w.shape[0] if transpose_w else w.shape[1]
    x2 = x.astype(jnp.float32).reshape(-1, K)
    out = _call(x2.shape[0], M)(x2, w, transpose_w=np.int64(transpose_w))
    return out.reshape((*x.shape[:-1], M))


def _xla(x: jax.Array, w: jax.Array, transpose_w: bool) -> jax.Array:
    spec = "...k,mk->...m" if transpose_w else "...k,km->...m"
    return jnp.einsum(spec, x.astype(jnp.float32), w.astype(jnp.float32))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, transpose_w: bool) -> jax.Array:
    return _kernel(x, w, transpose_w)


@_matmul.defjvp
def _matmul_jvp(transpose_w, primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = _kernel(x, w, transpose_w)
    return y, _xla(dx, w, transpose_w) + _xla(x, dw, transpose_w)


def matmul(
    x: Float[Array, "... K"], w: jax.Array, *, transpose_w: bool = False
) -> Float[Array, "... M"]:
    """float32 `x @ w` (`x @ w.T` with transpose_w) on the kernel; w float32 or bfloat16."""
    if not kernels.available():
        raise RuntimeError(kernels.status())
    w = jnp.asarray(w)
    if w.ndim != 2 or jnp.dtype(w.dtype) not in _W_DTYPES:
        raise ValueError(f"w must be 2-D float32 or bfloat16, got {w.dtype}{list(w.shape)}")
    K = w.shape[1] if transpose_w else w.shape[0]
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}], got {list(x.shape)}")
    return _matmul(jnp.asarray(x), w, transpose_w)


def _fits(x: jax.Array, w: jax.Array) -> bool:
    return (
        w.ndim == 2
        and jnp.dtype(w.dtype) in _W_DTYPES
        and jnp.dtype(x.dtype) in _W_DTYPES
        and enabled()
    )


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`jax.lax.dot_general` for `nn.Dense(dot_general=...)`: a Dense contraction (lhs's last
    axis with a 2-D kernel's first) of float32/bfloat16 runs on the kernel when `enabled()`,
    in the result dtype XLA would give; anything else is XLA's."""
    (lc, rc), (lb, rb) = dimension_numbers
    dense = tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and not lb and not rb
    if dense and _fits(lhs, rhs):
        out_dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
        return _matmul(lhs, rhs, False).astype(out_dtype)
    return jax.lax.dot_general(
        lhs, rhs, dimension_numbers, precision=precision,
        preferred_element_type=preferred_element_type,
    )  # fmt: skip


def head(x_BTE: jax.Array, table_VE: jax.Array, *, use_kernel: bool = True) -> jax.Array:
    """Tied-embedding logits `x [B, T, E] . table [V, E]` contracted on E (the table as
    stored, never transposed), in x's dtype; on the kernel when `use_kernel` and `enabled()`."""
    if use_kernel and _fits(x_BTE, table_VE):
        return _matmul(x_BTE, table_VE, True).astype(x_BTE.dtype)
    return jnp.einsum("bte,ve->btv", x_BTE, table_VE.astype(x_BTE.dtype))
