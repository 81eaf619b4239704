"""A batch-invariant float matmul for XLA:CPU (jaxspec/csrc/float_matmul.cc), as an FFI call.

Every dense layer of a float model and its tied head run through `dot_general` / `head`,
which on the CPU call a C++ kernel (built at install into the same library as the int4
kernel, `jaxspec.int4kernel.library()`), and elsewhere (GPU, TPU, float64, no compiler) are
XLA's own dot. The kernel exists for two reasons:

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
used when `enabled()`: the kernel is built and loaded, the default backend is the CPU, and
`JAXSPEC_FLOAT_KERNEL` is not "0". The choice is made when a function is traced.

Pure module: imports only jax, numpy, the standard library and `jaxspec.int4kernel`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxspec import int4kernel, trace_cache

TARGET = "jaxspec_float_matmul"
ATTENTION = "jaxspec_attention"
_W_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
_ISA_NAMES = {3: "AVX-512", 2: "AVX2", 0: "scalar"}
_ISA_CODES = {"best": 3, "AVX-512": 3, "AVX2": 2, "scalar": 0}

_lock = threading.Lock()
_registered: bool | None = None


def _lib():
    """The library with the handler registered (once), or None."""
    global _registered
    lib = int4kernel.library()
    if lib is None or not all(hasattr(lib, n) for n in ("JaxspecFloatMatmul", "JaxspecAttention")):
        return None
    with _lock:
        if _registered is None:
            lib.jaxspec_float_isa.restype = ctypes.c_int
            lib.jaxspec_float_set_isa.restype = ctypes.c_int
            lib.jaxspec_float_set_isa.argtypes = [ctypes.c_int]
            lib.jaxspec_float_set_threads.restype = ctypes.c_int
            lib.jaxspec_float_set_threads.argtypes = [ctypes.c_int]
            lib.jaxspec_attention_set_isa.restype = ctypes.c_int
            lib.jaxspec_attention_set_isa.argtypes = [ctypes.c_int]
            jax.ffi.register_ffi_target(
                TARGET, jax.ffi.pycapsule(lib.JaxspecFloatMatmul), platform="cpu"
            )
            jax.ffi.register_ffi_target(
                ATTENTION, jax.ffi.pycapsule(lib.JaxspecAttention), platform="cpu"
            )
            threads = os.environ.get("JAXSPEC_INT4_THREADS", "").strip()
            if threads.isdigit():
                lib.jaxspec_float_set_threads(int(threads))
            _registered = True
    return lib


def available() -> bool:
    """True when the compiled kernel is loaded and registered with XLA (never raises)."""
    try:
        return _lib() is not None
    except Exception:
        return False


trace_cache.before_load(available)  # a loaded trace may call this kernel untraced
trace_cache.key_part("float_kernel", lambda: "on" if enabled() else "off")


def enabled() -> bool:
    """Whether a function traced now runs its float matmuls on the kernel."""
    if os.environ.get("JAXSPEC_FLOAT_KERNEL", "") == "0":
        return False
    return jax.default_backend() == "cpu" and available()


def isa() -> str | None:
    """The kernel's code path on this CPU ("AVX-512", "AVX2" or "scalar"), None when not
    available."""
    lib = _lib() if available() else None
    return None if lib is None else _ISA_NAMES.get(lib.jaxspec_float_isa(), "unknown")


def set_isa(name: str) -> str:
    """Forces the code path of the matmul and the attention ("scalar", "AVX2", "AVX-512", each
    only as far as the CPU has it; "best" is the default). Returns the matmul's path now in
    use. Every path gives the same bits (tests hold them to that)."""
    lib = _lib()
    if lib is None:
        raise RuntimeError(status())
    code = _ISA_CODES[name]
    lib.jaxspec_attention_set_isa(min(code, 2))
    return _ISA_NAMES[lib.jaxspec_float_set_isa(code)]


def set_threads(n: int) -> int:
    """Caps the threads one call uses (the calling one included); 0 = XLA's pool size."""
    lib = _lib()
    if lib is None:
        raise RuntimeError(status())
    return lib.jaxspec_float_set_threads(n)


def status() -> str:
    """One line for start-up and doctor output."""
    if available():
        return f"float kernel: {isa()} (batch-invariant f32/bf16 weight matmul)"
    why = int4kernel.why_unavailable() or "the library has no float handler (rebuild)"
    return f"float kernel: {why} - XLA dot path (rows not batch-invariant)"


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
    if not available():
        raise RuntimeError(status())
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


def attention(
    q_BTKGD: Float[Array, "B T K G D"],
    keys_BSKD: Float[Array, "B S K D"],
    vals_BSKD: Float[Array, "B S K D"],
    positions_BT: jax.Array,
) -> Float[Array, "B T K G D"]:
    """Grouped-query attention on the kernel: query (b, t) sees cache indices
    `s <= positions[b, t]` (and `s < S`); float32 in and out. Every number is summed in an
    order fixed by D and the query's position alone (csrc/attention.cc), so a position's output
    does not depend on T, B or the KV bucket S. Gradients: XLA's einsum form (a custom JVP)."""
    if not available():
        raise RuntimeError(status())
    f32 = jnp.float32
    return _attention(
        q_BTKGD.astype(f32),
        keys_BSKD.astype(f32),
        vals_BSKD.astype(f32),
        jnp.asarray(positions_BT, jnp.int32),
    )


def _attention_kernel(q, k, v, pos):
    call = jax.ffi.ffi_call(
        ATTENTION, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential"
    )
    return call(q, k, v, pos)


def _attention_xla(q, k, v, pos):
    """The same attention in XLA's ops (jaxspec.model's accelerator form), for gradients."""
    S, D = k.shape[1], q.shape[-1]
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k) / np.sqrt(D).astype(np.float32)
    visible = jnp.arange(S)[None, None, :] <= pos[:, :, None]
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    return jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(scores, axis=-1), v)


@jax.custom_jvp
def _attention(q, k, v, pos):
    return _attention_kernel(q, k, v, pos)


@_attention.defjvp
def _attention_jvp(primals, tangents):
    q, k, v, pos = primals
    dq, dk, dv, _ = tangents
    _, tangent = jax.jvp(lambda q, k, v: _attention_xla(q, k, v, pos), (q, k, v), (dq, dk, dv))
    return _attention_kernel(q, k, v, pos), tangent
