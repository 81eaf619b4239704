"""Weight quantization of a `Model` (W8A16, W4A16, W4A4) on AQT, with real 4-bit storage.

`quantize(model, "w4a16", group_size=128)` runs AQT's TRAIN -> CONVERT -> SERVE flow:

    TRAIN    float kernels, every matmul fake-quantized by `AqtDotGeneral` (`mode="train"`)
    CONVERT  one forward freezes each weight's ints and scales (AQT's "aqt" collection)
    SERVE    the served model holds only the frozen ints (int4 packed two per byte) and
             scales; each jitted matmul unpacks and hands them to `AqtDotGeneral` (SERVE)

What is quantized: every linear layer (q/k/v/o, gate/up/down) and, by default
(`embeddings=True`), the token embedding and the lm_head too — one table when they are
tied, as in the shipped default pair, where the 4096-token embedding is 59 % of the draft's
weights: with it in bf16 the w4a16 draft keeps 0.70x of its bf16 bytes, quantized 0.26x, for
+0.6% against +1.4% held-out perplexity (tools/quality_w4a16.py). Attention scores, RMSNorm and the
softmax stay in float; norm scales, biases (and the embedding with `embeddings=False`) are
stored in bfloat16. Activations run in `model.dtype`, unquantized except under "w4a4".

Scales of method "rtn": symmetric absmax (a group's largest |w| maps to 2^(b-1) - 1 exactly;
`aqt_compat` says why that is not AQT's default), one bfloat16 scale per output column and per
group of `group_size` consecutive inputs (the contraction axis); `group_size=None` is
per-channel (one group). A contraction axis that `group_size` does not divide is zero-padded
to whole groups inside the matmul; only the real rows are stored. The other methods
(`jaxspec.quant.methods`) store float16 scales of the same shape, plus a float16 `minimum` of
that shape for the asymmetric ones; a head of `head_method="absmax"` (GGUF's Q8_0 at 8 bits)
has `qweight` and `scale` only: w = scale * q.

Storage of a `[K, M]` weight (`qweight`, `scale`, plus `bias` when the layer has one):

    int4, packed   qweight uint8 [ceil(K/2), M]: row i holds q[i] in the low nibble and
                   q[i + ceil(K/2)] in the high nibble (two's complement)
    int4, unpacked qweight int4 [K, M]  (`packed=False`: XLA on CPU spends a byte on each)
    int8           qweight int8 [K, M]
    scales         scale bfloat16 [ceil(K/group), M]  (float16 for the numpy methods)
    minimum        minimum float16 [ceil(K/group), M]  (asymmetric methods only)

The embedding is stored transposed, `[hidden, vocab]`, as the weight of `attend`; a lookup
gathers the columns of its tokens and unpacks only those.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import kernels
from jaxspec.kernels import int4 as int4kernel
from jaxspec.kernels import int8 as int8kernel
from jaxspec.nn.config import CheckpointError
from jaxspec.nn.model import Llama, Model, init_cache
from jaxspec.quant import aqt_compat
from jaxspec.quant import methods as quant_methods

SCHEMES: dict[str, tuple[int, int | None] | None] = {
    "none": None,
    "w8a16": (8, None),
    "w4a16": (4, None),
    "w4a4": (4, 4),
}
SCALE_DTYPE = aqt_compat.SCALE_DTYPE
STORE_DTYPE = jnp.bfloat16  # everything that is not quantized
QUANT_METHOD = "jaxspec-aqt"
METHODS = ("gptq", "clip", "asym", "rtn")  # `quantize(method=...)`; quant_methods says how
HEAD_METHODS = quant_methods.SYMMETRIC  # `quantize(head_method=...)`: "absmax" (GGUF's Q8_0)
DEFAULT_METHOD = "gptq"  # the best measured on SmolLM2 (docs/quantization.md)
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------- int4 packing


def pack_int4(q_KM: jax.Array) -> jax.Array:
    """Pack int values in [-8, 7] two per byte along axis 0: `[K, ...]` -> uint8 `[ceil(K/2), ...]`.

    Row i of the result holds `q[i]` (low nibble) and `q[i + ceil(K/2)]` (high nibble; zero
    when K is odd and i is the last row)."""
    K = q_KM.shape[0]
    h = -(-K // 2)
    q = jnp.asarray(q_KM).astype(jnp.int8)
    q = jnp.pad(q, [(0, 2 * h - K)] + [(0, 0)] * (q.ndim - 1))
    lo = q[:h].astype(jnp.uint8) & jnp.uint8(0xF)
    hi = q[h:].astype(jnp.uint8) & jnp.uint8(0xF)
    return lo | (hi << jnp.uint8(4))


def unpack_int4(packed: jax.Array, K: int) -> jax.Array:
    """Inverse of `pack_int4`: uint8 `[ceil(K/2), ...]` -> int8 `[K, ...]`."""
    p = jnp.asarray(packed, jnp.uint8)
    nibbles = jnp.concatenate([p & jnp.uint8(0xF), p >> jnp.uint8(4)], axis=0)[:K]
    return (nibbles.astype(jnp.int8) ^ jnp.int8(8)) - jnp.int8(8)  # sign-extend 4 bits


TILE = int4kernel.TILE  # output columns per tile of the tiled int4 layout
KERNEL_MAX_ROWS = 1024  # rows (tokens) up to which a served matmul uses its kernel: prefill
# too (16 until 2026-12: a 44-token prompt's W4A16 prefill then took XLA's path, 0.74 s vs 0.24 s)


def pack_tiles(q_KM: jax.Array) -> jax.Array:
    """int values in [-8, 7] `[K, M]` -> the tiled layout uint8 `[ceil(M/64), K, 32]` that
    the int4 kernel reads (`jaxspec.kernels.int4`): for tile t and row k, 8 little-endian
    uint32 words, nibble i of word j = q + 8 of column 64 t + 8 i + j (M padded with q = 0)."""
    K, M = q_KM.shape
    T = -(-M // TILE)
    u = jnp.asarray(q_KM).astype(jnp.int32) + 8
    u = jnp.pad(u, ((0, 0), (0, T * TILE - M)), constant_values=8).astype(jnp.uint8)
    u = u.reshape(K, T, 8, 8).transpose(1, 0, 3, 2)  # [T, K, j (word), i (nibble)]
    u = u.reshape(T, K, 8, 4, 2)  # nibble i = 2 b + h sits in byte b of its word
    return (u[..., 0] | (u[..., 1] << jnp.uint8(4))).reshape(T, K, 32)


def _tile_nibbles(tiles: jax.Array) -> jax.Array:
    """uint8 `[..., K, 32]` tile rows -> int8 q `[..., K, 64]` (column 8 i + j of the tile)."""
    b = tiles.reshape(*tiles.shape[:-1], 8, 4)  # [..., j, byte]
    nib = jnp.stack([b & jnp.uint8(0xF), b >> jnp.uint8(4)], axis=-1)  # [..., j, byte, h]
    nib = nib.reshape(*tiles.shape[:-1], 8, 8)  # [..., j, i]
    q = jnp.swapaxes(nib, -1, -2).reshape(*tiles.shape[:-1], TILE)  # [..., 8 i + j]
    return q.astype(jnp.int8) - jnp.int8(8)


def unpack_tiles(tiles: jax.Array, M: int) -> jax.Array:
    """Inverse of `pack_tiles`: uint8 `[T, K, 32]` -> int8 `[K, M]`."""
    T, K, _ = tiles.shape
    return _tile_nibbles(tiles).transpose(1, 0, 2).reshape(K, T * TILE)[:, :M]


def take_tile_columns(tiles: jax.Array, cols: jax.Array) -> jax.Array:
    """Columns `cols [N]` of a tiled weight as int8 `[K, N]` (the embedding lookup), reading
    only their tiles."""
    q = _tile_nibbles(jnp.take(tiles, cols // TILE, axis=0))  # [N, K, 64]
    idx = jnp.broadcast_to((cols % TILE)[:, None, None], (*q.shape[:2], 1))
    return jnp.take_along_axis(q, idx, axis=2)[..., 0].T


# ----------------------------------------------------------------------------- layers


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """Static description of a quantized model (hashable: it is part of the jit key).

    `method` "rtn" is symmetric absmax through AQT's own calibration (bfloat16 scale);
    "absmax" is GGUF's Q8_0 rule (`methods.quantize_absmax`: symmetric, float16 scale,
    no minimum; only as `head_method`); the others (`jaxspec.quant.methods.METHODS`) are
    asymmetric and store a float16 `minimum` beside the float16 `scale`. `head_bits` and
    `head_method` (None: as the rest) quantize the token embedding / lm_head at other bits
    and by another method; `bits` overrides the scheme's weight bits (set on the head's own
    spec)."""

    scheme: str
    group_size: int | None = None
    embeddings: bool = True
    packed: bool = True
    method: str = "rtn"
    head_bits: int | None = None
    bits: int | None = None
    layout: str = "tiles"  # packed int4: "tiles" (pack_tiles), or "rows" (pack_int4, read only)
    kernel: bool = True  # the int4 kernel where it applies (False: XLA's path, for comparison)
    head_method: str | None = None

    @property
    def weight_bits(self) -> int:
        return self.bits or SCHEMES[self.scheme][0]

    @property
    def asymmetric(self) -> bool:
        return self.method not in ("rtn", *quant_methods.SYMMETRIC)

    @property
    def scale_dtype(self) -> Any:
        return SCALE_DTYPE if self.method == "rtn" else jnp.float16

    def head(self) -> QuantSpec:
        """The spec of the token embedding and lm_head."""
        if self.head_bits is None and self.head_method is None:
            return self
        return dataclasses.replace(
            self, bits=self.head_bits or self.bits, head_bits=None,
            method=self.head_method or self.method, head_method=None,
        )  # fmt: skip

    @property
    def act_bits(self) -> int | None:
        return SCHEMES[self.scheme][1]

    def groups(self, K: int) -> tuple[int, int]:
        """(group size, number of groups) of a contraction axis of size K."""
        g = K if self.group_size is None or self.group_size >= K else self.group_size
        return g, -(-K // g)

    @property
    def tiled(self) -> bool:
        return self.weight_bits == 4 and self.packed and self.layout == "tiles"

    def stored(self, K: int, M: int) -> tuple[tuple[int, ...], Any]:
        """Shape and dtype of the stored ints of a `[K, M]` weight."""
        if self.tiled:
            return (-(-M // TILE), K, 32), jnp.uint8
        if self.weight_bits == 4 and self.packed:
            return (-(-K // 2), M), jnp.uint8
        return (K, M), aqt_compat.qvalue_dtype(self.weight_bits)

    def pack(self, q_KM: jax.Array) -> jax.Array:
        """int8 q `[K, M]` -> the stored ints."""
        if self.tiled:
            return pack_tiles(q_KM)
        if self.weight_bits == 4 and self.packed:
            return pack_int4(q_KM)
        return q_KM.astype(self.stored(*q_KM.shape)[1])

    @property
    def int8_symmetric(self) -> bool:
        """Stored as int8 [K, M] with a scale per group and no minimum (W = scale * q): what
        the int8 kernel reads (a head of `head_method="absmax"`, GGUF's Q8_0)."""
        return self.weight_bits == 8 and not self.asymmetric

    def use_kernel(self, rows: int) -> bool:
        """Whether a served matmul of `rows` rows runs on a kernel (decided at trace): the int4
        one for tiled int4, the int8 one for symmetric int8."""
        return (
            self.kernel and (self.tiled or self.int8_symmetric) and self.act_bits is None
            and rows <= KERNEL_MAX_ROWS and kernels.available()
            and jax.default_backend() == "cpu"
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("kernel", "layout")}
        return out | {"int4_layout": self.layout}  # "layout" is the file's pointer to the doc


def _ints(spec: QuantSpec, qweight: jax.Array, K: int, M: int) -> jax.Array:
    """Stored ints of a `[K, M]` weight -> int8 `[G, group, M]` (zero-padded to whole groups)."""
    if spec.tiled:
        q = unpack_tiles(qweight, M)
    elif spec.weight_bits == 4 and spec.packed:
        q = unpack_int4(qweight, K)
    else:
        q = qweight.astype(jnp.int8)
    return _grouped(spec, q)


def _grouped(spec: QuantSpec, q_KM: jax.Array) -> jax.Array:
    """int8 `[K, M]` -> `[G, group, M]`, zero-padded to whole groups."""
    K = q_KM.shape[0]
    g, G = spec.groups(K)
    return jnp.pad(q_KM, ((0, G * g - K), (0, 0))).reshape(G, g, q_KM.shape[1])


def _pad_rows(w: jax.Array, rows: int) -> jax.Array:
    return jnp.pad(w, ((0, rows - w.shape[0]), (0, 0)))


def _pad_cols(x: jax.Array, cols: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, cols - x.shape[1])))


class _Matmul(nn.Module):
    """`x [N, Kp] @ w [Kp, M]` through AQT; owns the `AqtDotGeneral` (and what CONVERT froze).

    Served asymmetric weights (`scale * q + offset`, `jaxspec.quant.methods`) go through the
    same int dot, plus the offset's share: each group's sum of x times its offset."""

    spec: QuantSpec
    mode: str
    group: int

    @nn.compact
    def __call__(self, x, w=None, served=None, minimum=None):
        s = self.spec
        y = aqt_compat.matmul(
            x, w, mode=self.mode, weight_bits=s.weight_bits, act_bits=s.act_bits,
            group=self.group, served=served,
        )  # fmt: skip
        if minimum is None:
            return y
        return y + _offset_term(x, served[1], minimum, self.group, s.weight_bits)


def _offset(scale_GM, minimum_GM, bits: int) -> jax.Array:
    """float32 offset of the served form `scale * q + offset` (`quant_methods.offset`)."""
    return minimum_GM.astype(jnp.float32) + (2 ** (bits - 1)) * scale_GM.astype(jnp.float32)


def _offset_term(x_NK, scale_GM, minimum_GM, group: int, bits: int) -> jax.Array:
    """sum_g (sum of x over group g) * offset[g]: the offset's share of `x @ w` (float32)."""
    N, K = x_NK.shape
    xsum_NG = x_NK.astype(jnp.float32).reshape(N, K // group, group).sum(-1)
    return (xsum_NG @ _offset(scale_GM, minimum_GM, bits)).astype(x_NK.dtype)


def _served_matmul(spec, matmul, x_NK, qweight, scale, minimum, K: int, M: int) -> jax.Array:
    """A served `x [N, Kp] @ w [K, M]`: the int4 or int8 kernel for a few rows where it is
    built (`QuantSpec.use_kernel`), else AQT's int dot (`_Matmul`), the same numbers to float
    rounding."""
    N = x_NK.shape[0]
    if not spec.use_kernel(N):
        return matmul(x_NK, served=(_ints(spec, qweight, K, M), scale), minimum=minimum)
    g, _ = spec.groups(K)
    x = x_NK[:, :K].astype(jnp.float32)
    if spec.int8_symmetric:  # W = scale * q, int8 [K, M] read as it is stored
        return int8kernel.matmul(x, qweight, scale, group=g).astype(x_NK.dtype)
    # the stored minimum as it is (float16): W = scale * (q + 8) + minimum, inside the kernel
    y = int4kernel.matmul(x, qweight, scale, K=K, M=M, group=g, minimum=minimum)
    return y.astype(x_NK.dtype)


def _served_params(module: nn.Module, spec: QuantSpec, K: int, M: int) -> tuple[Any, Any, Any]:
    """Declare a served `[K, M]` weight's params: (qweight, scale, minimum or None)."""
    _, G = spec.groups(K)
    shape, dtype = spec.stored(K, M)
    qweight = module.param("qweight", nn.initializers.zeros_init(), shape, dtype)
    scale = module.param("scale", nn.initializers.ones_init(), (G, M), spec.scale_dtype)
    if not spec.asymmetric:
        return qweight, scale, None
    minimum = module.param("minimum", nn.initializers.zeros_init(), (G, M), spec.scale_dtype)
    return qweight, scale, minimum


class QuantDense(nn.Module):
    """A drop-in for `nn.Dense` (kernel `[K, M]`) whose matmul is quantized by AQT.

    Params: mode "train"/"convert": `kernel` (float) [+ `bias`]; mode "serve": `qweight`,
    `scale` [+ `bias`] (module doc) — no float kernel exists in a served model.
    """

    features: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    spec: QuantSpec = QuantSpec("w4a16")
    mode: str = "serve"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        K, M = x.shape[-1], self.features
        g, G = self.spec.groups(K)
        x_NK = _pad_cols(x.reshape(-1, K).astype(self.dtype), G * g)
        matmul = _Matmul(self.spec, self.mode, g, name="matmul")
        if self.mode == "serve":
            qweight, scale, minimum = _served_params(self, self.spec, K, M)
            y = _served_matmul(self.spec, matmul, x_NK, qweight, scale, minimum, K, M)
        else:
            kernel = self.param("kernel", nn.initializers.lecun_normal(), (K, M))
            y = matmul(x_NK, _pad_rows(kernel.astype(self.dtype), G * g))
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros_init(), (M,))
            y = y + bias.astype(self.dtype)[None, :]
        return y.astype(self.dtype).reshape(*x.shape[:-1], M)


class QuantEmbed(nn.Module):
    """A drop-in for `nn.Embed` (`__call__` lookup, `attend` for tied heads), quantized.

    The table is quantized as the weight `[hidden, vocab]` of `attend`, groups along hidden;
    a lookup dequantizes the gathered columns, so it sees exactly the values `attend` uses.
    Params: "train"/"convert": `embedding` `[vocab, hidden]` (float); "serve": `qweight`,
    `scale` of the transposed table.
    """

    num_embeddings: int
    features: int
    dtype: Any = jnp.float32
    spec: QuantSpec = QuantSpec("w4a16")
    mode: str = "serve"

    def setup(self) -> None:
        H, V = self.features, self.num_embeddings
        g, _ = self.spec.groups(H)
        if self.mode == "serve":
            self.qweight, self.scale, self.minimum = _served_params(self, self.spec, H, V)
        else:
            self.embedding = self.param("embedding", nn.initializers.normal(1.0), (V, H))
        self.matmul = _Matmul(self.spec, self.mode, g)

    def _columns(self, cols: jax.Array) -> jax.Array:
        """The table's columns `cols [N]` (one per token) as int8 `[G, group, N]`."""
        if self.spec.tiled:
            return _grouped(self.spec, take_tile_columns(self.qweight, cols))
        H = self.features
        return _ints(self.spec, jnp.take(self.qweight, cols, axis=1), H, cols.shape[0])

    def _weight(self) -> jax.Array:
        """The float table transposed and zero-padded: `[G * group, vocab]`."""
        g, G = self.spec.groups(self.features)
        return _pad_rows(self.embedding.T.astype(self.dtype), G * g)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        H = self.features
        flat = tokens.reshape(-1)
        g, G = self.spec.groups(H)
        if self.mode == "serve":
            q = self._columns(flat)  # [G, g, N]
            s = jnp.take(self.scale, flat, axis=1)  # [G, N]
            if self.minimum is not None:
                m = jnp.take(self.minimum, flat, axis=1).astype(self.dtype)
                h = 2 ** (self.spec.weight_bits - 1)
                q = q.astype(self.dtype) + h  # scale * (q + h) + minimum
                table = q * s.astype(self.dtype)[:, None, :] + m[:, None, :]
                return table.reshape(G * g, -1)[:H].T.reshape(*tokens.shape, H)
        elif self.mode == "train":
            q, s = aqt_compat.fake_quant_table(
                self._weight().reshape(G, g, -1), self.spec.weight_bits
            )
            q, s = jnp.take(q, flat, axis=2), jnp.take(s, flat, axis=1)
        else:  # convert: freeze the table through `attend`; the lookup itself does not matter
            self.attend(jnp.zeros((1, H), self.dtype))
            return jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)
        table = q.astype(self.dtype) * s.astype(self.dtype)[:, None, :]
        return table.reshape(G * g, -1)[:H].T.reshape(*tokens.shape, H)

    def attend(self, x: jax.Array) -> jax.Array:
        H, V = self.features, self.num_embeddings
        g, G = self.spec.groups(H)
        x_NK = _pad_cols(x.reshape(-1, H).astype(self.dtype), G * g)
        if self.mode == "serve":
            y = _served_matmul(
                self.spec, self.matmul, x_NK, self.qweight, self.scale, self.minimum, H, V
            )
        else:
            y = self.matmul(x_NK, self._weight())
        return y.astype(self.dtype).reshape(*x.shape[:-1], V)


@dataclasses.dataclass(frozen=True)
class DenseFactory:
    """`Model.dense_cls` of a quantized model: builds a `QuantDense` where `nn.Dense` was."""

    spec: QuantSpec
    mode: str = "serve"

    def __call__(
        self,
        features: int,
        *,
        use_bias: bool = True,
        dtype: Any = jnp.float32,
        dot_general_cls: Any = None,
        name: str | None = None,
    ) -> nn.Module:
        if dot_general_cls is not None:
            raise ValueError("a quantized model takes no other dot_general_cls")
        if name == "lm_head" and not self.spec.embeddings:
            return nn.Dense(features, use_bias=use_bias, dtype=dtype, name=name)
        spec = self.spec.head() if name == "lm_head" else self.spec
        return QuantDense(features, use_bias, dtype, spec, self.mode, name=name)


@dataclasses.dataclass(frozen=True)
class EmbedFactory:
    """`Model.embed_cls` of a quantized model: builds a `QuantEmbed`."""

    spec: QuantSpec
    mode: str = "serve"

    def __call__(
        self, num_embeddings: int, features: int, *, dtype: Any = jnp.float32, name: str
    ) -> nn.Module:
        spec = self.spec.head()
        return QuantEmbed(num_embeddings, features, dtype, spec, self.mode, name=name)


# ----------------------------------------------------------------------------- quantize


def quant_spec(model: Model) -> QuantSpec | None:
    """The `QuantSpec` of a quantized model, None for a float one."""
    f = model.dense_cls
    return f.spec if isinstance(f, DenseFactory) else None


def with_kernel(model: Model, enabled: bool) -> Model:
    """The served quantized `model` with the int4 kernel on or off (off: XLA's unpack and AQT's
    int dot everywhere). Same params; a different static module (its own compilations)."""
    spec = quant_spec(model)
    if spec is None or model.dense_cls.mode != "serve":
        raise ValueError("with_kernel wants a served quantized model (see jaxspec.quantize)")
    m = _module(model, dataclasses.replace(spec, kernel=enabled), "serve")
    return model.with_params(model.params, dense_cls=m.dense_cls, embed_cls=m.embed_cls)


def _module(model: Model, spec: QuantSpec, mode: str) -> Llama:
    embed = EmbedFactory(spec, mode) if spec.embeddings else None
    return Llama(model.config, model.dtype, None, DenseFactory(spec, mode), embed)


def _quantized_leaf(spec: QuantSpec, keys: tuple[str, ...]) -> bool:
    """Whether a float param is quantized (else it is stored in bfloat16)."""
    if keys[-1] == "embedding":
        return spec.embeddings
    if keys[-1] == "kernel":
        return spec.embeddings or keys[0] != "lm_head"
    return False


def quantize(
    model: Model,
    scheme: str,
    group_size: int | None = None,
    *,
    method: str | None = None,
    head_bits: int | None = None,
    head_method: str | None = None,
    calibration: Sequence[Sequence[int]] | None = None,
    embeddings: bool = True,
    packed: bool = True,
    mode: str = "serve",
    progress: Callable[[str, int, int], None] | None = None,
) -> Model:
    """The model with quantized weights (see the module doc).

    Args:
      model: a float `Model` (float32 or bfloat16 activations).
      scheme: "none" (the model itself), "w8a16", "w4a16" or "w4a4".
      group_size: inputs per scale along the contraction axis (e.g. 128 or 32); None is
        one scale per output channel.
      method: how weights become ints: "gptq" (the default for w4a16/w8a16: the best
        measured, docs/quantization.md), "clip", "asym" (`jaxspec.quant.methods`) or "rtn"
        (symmetric absmax, AQT's calibration; the only one for w4a4 and mode="train").
      head_bits: bits of the token embedding / lm_head (e.g. 8); None: as the other layers.
      head_method: how the token embedding / lm_head become ints; None: as the other layers
        (GPTQ's head has a Hessian of its own), "absmax": GGUF's Q8_0 rule (symmetric, one
        float16 scale per group, round half away from zero, no calibration), which gives a
        table that was Q8_0 at `group_size` back bit for bit. Not with method "rtn".
      calibration: token sequences whose activations GPTQ's Hessians are taken on; None
        builds them (`jaxspec.quant.calibration`: chat prompts from CPython's own documentation
        and the model's answers to them). Ignored by the other methods.
      embeddings: also quantize the token embedding and lm_head (else they stay bfloat16).
      packed: store int4 two per byte (False: one int4 per byte, for comparison).
      mode: "serve" (frozen ints, no float kernels) or "train" (float kernels, AQT
        fake-quantization at every call: the reference the served "rtn" model must match).
      progress: called as progress(stage, done, total) ("answers", "hessians", "weights"
        for GPTQ without `calibration`; the others have "weights" only), each stage first with
        done = 0 as it begins, then as its parts finish (weights one by one).

    Returns:
      A `Model` usable wherever a model is (`generate` as target or draft, `save`, ...);
      `nbytes()` is its resident size.
    """
    method = _check_quantize(model, scheme, group_size, method, head_bits, mode)
    _check_head_method(method, head_method, embeddings)
    if scheme == "none":
        return model
    if head_bits == SCHEMES[scheme][0]:
        head_bits = None
    spec = QuantSpec(scheme, group_size, embeddings, packed, method, head_bits,
                     head_method=head_method)  # fmt: skip

    def keep_or_store(path: Any, leaf: jax.Array) -> jax.Array:
        keys = tuple(str(p.key) for p in path)
        return leaf if _quantized_leaf(spec, keys) else leaf.astype(STORE_DTYPE)

    float_params = jax.tree_util.tree_map_with_path(keep_or_store, model.params)
    suffix = f"{scheme}" + ("" if group_size is None else f"-g{group_size}")
    suffix += "" if method == "rtn" else f"-{method}"
    suffix += "" if head_bits is None else f"-head{head_bits}"
    suffix += "" if head_method is None else f"-head-{head_method}"
    if mode == "train":
        m = _module(model, spec, "train")
        name = f"{model.name}:{suffix}:train"
        return model.with_params(
            float_params, dense_cls=m.dense_cls, embed_cls=m.embed_cls, name=name
        )
    served = _quantized_params(model, spec, float_params, calibration, progress)
    m = _module(model, spec, "serve")
    return model.with_params(
        served, dense_cls=m.dense_cls, embed_cls=m.embed_cls, name=f"{model.name}:{suffix}"
    )


def _check_quantize(
    model: Model,
    scheme: str,
    group_size: int | None,
    method: str | None,
    head_bits: int | None,
    mode: str,
) -> str:
    """`quantize`'s arguments checked (ValueError naming the bad one); returns the method."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {sorted(SCHEMES)}")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be a positive int or None, got {group_size!r}")
    if mode not in ("serve", "train"):
        raise ValueError(f"mode must be 'serve' or 'train', got {mode!r}")
    if model.dense_cls is not None or model.embed_cls is not None:
        raise ValueError(
            f"model {model.name!r} is already quantized: use it as it is (a quantized model "
            "drafts and serves without quantize(); `jaxspec.load('smollm2-draft')` and "
            "`jaxspec.load('smollm2-w4a16')` are ready-made W4A16 drafts), or quantize a float "
            "checkpoint, e.g. `jaxspec.quantize(jaxspec.load('smollm2'), 'w4a16', group_size=32)`"
        )
    if model.dot_general_cls is not None:
        raise ValueError("quantize() needs a model without a custom dot_general_cls")
    method = method or ("rtn" if scheme == "w4a4" or mode == "train" else DEFAULT_METHOD)
    if method not in ("rtn", *quant_methods.METHODS):
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if method != "rtn" and (scheme == "w4a4" or mode == "train"):
        raise ValueError(f"method {method!r} is for served w4a16/w8a16; w4a4 and train use rtn")
    if head_bits not in (None, 4, 8):
        raise ValueError(f"head_bits must be 4, 8 or None, got {head_bits!r}")
    if scheme == "none":
        return method
    dtypes = {jnp.dtype(model.dtype)} | {jnp.dtype(a.dtype) for a in jax.tree.leaves(model.params)}
    if not dtypes <= {jnp.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16)}:
        raise ValueError(
            f"AQT quantizes float32/bfloat16/float16 models, got {sorted(map(str, dtypes))}"
        )
    return method


def _check_head_method(method: str, head_method: str | None, embeddings: bool) -> None:
    """`quantize`'s head_method checked against its method (ValueError naming it)."""
    if head_method is None:
        return
    if head_method not in HEAD_METHODS:
        raise ValueError(f"unknown head_method {head_method!r}; choose one of {HEAD_METHODS}")
    if method == "rtn":
        raise ValueError(
            "head_method is for the numpy methods (gptq, clip, asym); 'rtn' is AQT's own "
            "symmetric absmax already (bfloat16 scales): give head_bits alone"
        )
    if not embeddings:
        raise ValueError("head_method with embeddings=False: the head is not quantized")


def _quantized_params(
    model: Model,
    spec: QuantSpec,
    float_params: Any,
    calibration: Sequence[Sequence[int]] | None,
    progress: Callable[[str, int, int], None] | None,
) -> Any:
    """The SERVE module's params (ints and scales) of `spec.method`, checked against the
    shapes and int dtypes the module expects."""
    if spec.method == "rtn":
        served = _convert(_module(model, spec, "convert"), spec, float_params)
    else:
        hessians = {}
        if spec.method == "gptq":
            hessians = _calibration_hessians(model, calibration, progress)
        served = _quantize_asym(spec, float_params, hessians, progress)
    m = _module(model, spec, "serve")
    expected = jax.tree.map(_shape_and_int_dtype, jax.eval_shape(lambda: _init(m, model.config)))
    if expected != jax.tree.map(_shape_and_int_dtype, served):
        raise AssertionError("the served params do not match the SERVE module")
    return served


def _calibration_hessians(
    model: Model, calibration: Sequence[Sequence[int]] | None, progress: Any
) -> dict[tuple[str, ...], Any]:
    """GPTQ's Hessians on `calibration`, or on the default answers; while those are generated,
    a second thread compiles the Hessians' probe (compilation is one core's work)."""
    from jaxspec.quant import calibration as calib

    if calibration:
        return calib.hessians(model, calibration, progress=progress)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe") as pool:
        probe = pool.submit(calib.compiled_probe, model)
        seqs = calib.default_sequences(model, progress=progress)
        return calib.hessians(model, seqs, progress=progress, probe=probe.result())


def _quantize_asym(
    spec: QuantSpec, float_params: Any, hessians: dict[tuple[str, ...], Any], progress: Any
) -> Any:
    """The served params of an asymmetric method: each quantized float weight replaced by
    {qweight, scale, minimum} (`jaxspec.quant.methods`, in numpy, all weights in one
    `quantize_many` call: shared Hessians once, on every CPU); a head of a symmetric
    `head_method` by {qweight, scale}, from the float table alone (no Hessian)."""
    owners: dict[tuple[str, ...], QuantSpec] = {}
    jobs = []

    def collect(node: Any, path: tuple[str, ...]) -> None:
        if _owns_weight(spec, node, path):
            embed = "embedding" in node
            s = spec.head() if embed or path[0] == "lm_head" else spec
            w = np.asarray(node["embedding"], np.float32).T if embed else np.asarray(node["kernel"])
            owners[path] = s
            h = hessians.get(path) if s.method == spec.method else None
            g = s.groups(w.shape[0])[0]
            jobs.append(quant_methods.Job(w, h, s.weight_bits, g, s.method))
        elif isinstance(node, dict):
            for k, v in node.items():
                collect(v, (*path, k))

    collect(dict(float_params), ())
    report = None if progress is None else (lambda done: progress("weights", done, len(jobs)))
    if report:
        report(0)
    done = dict(zip(owners, quant_methods.quantize_many(jobs, spec.method, report), strict=True))

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if path in done:
            qz, s = done[path], owners[path]
            out = {k: v for k, v in node.items() if k not in ("kernel", "embedding")}
            out |= {"qweight": s.pack(jnp.asarray(qz.q)), "scale": jnp.asarray(qz.scale)}
            return out if qz.minimum is None else out | {"minimum": jnp.asarray(qz.minimum)}
        if isinstance(node, dict):
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        return node

    return walk(dict(float_params), ())


def _owns_weight(spec: QuantSpec, node: Any, path: tuple[str, ...]) -> bool:
    """Whether `node` is a layer whose kernel or embedding `spec` quantizes."""
    return isinstance(node, dict) and (
        (_quantized_leaf(spec, (*path, "kernel")) and "kernel" in node)
        or (_quantized_leaf(spec, (*path, "embedding")) and "embedding" in node)
    )


def _flatten_paths(params: Any) -> list[tuple[str, ...]]:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [tuple(str(p.key) for p in path) for path, _ in flat]


def dequantize(model: Model, dtype: Any = jnp.float32) -> Model:
    """The float model whose weights are the quantized model's ints times their scales, in
    `dtype`: what a peer without int4 kernels runs (`jaxspec.save` then writes a plain HF
    checkpoint). Its matmuls are float, so logits differ from the quantized model's by the
    activation rounding only.

    Raises:
      ValueError: `model` is not quantized (see `quantize`) or not a served model.
    """
    spec = quant_spec(model)
    if spec is None or model.dense_cls.mode != "serve":
        raise ValueError("dequantize wants a served quantized model (see jaxspec.quantize)")
    float_shapes = jax.eval_shape(lambda: _init(Llama(model.config, model.dtype), model.config))

    def weight(node: dict[str, Any], K: int, s: QuantSpec) -> jax.Array:
        M = node["scale"].shape[1]
        q = _ints(s, node["qweight"], K, M).astype(jnp.float32)  # [G, g, M]
        scale = node["scale"].astype(jnp.float32)[:, None, :]
        w = q * scale
        if "minimum" in node:
            w = (q + 2 ** (s.weight_bits - 1)) * scale + node["minimum"].astype(jnp.float32)[
                :, None, :
            ]
        return w.reshape(-1, w.shape[-1])[:K]  # [K, M]

    def walk(shapes: Any, node: Any, path: tuple[str, ...] = ()) -> Any:
        if not isinstance(shapes, dict):
            return jnp.asarray(node, dtype)
        out = {}
        head = spec.head() if path[:1] in (("lm_head",), ("embed_tokens",)) else spec
        for k, v in shapes.items():
            if k == "kernel" and "qweight" in node:
                out[k] = weight(node, v.shape[0], head).astype(dtype)
            elif k == "embedding" and "qweight" in node:
                out[k] = weight(node, v.shape[1], head).T.astype(dtype)  # [V, H]
            else:
                out[k] = walk(v, node[k], (*path, k))
        return out

    params = walk(dict(float_shapes), dict(model.params))
    return Model(
        config=model.config,
        params=params,
        tokenizer=model.tokenizer,
        dtype=model.dtype,
        name=f"{model.name}:dequantized",
    )


def _shape_and_int_dtype(a: Any) -> tuple[Any, ...]:
    """What the stored params of a SERVE module must match (float dtypes are free)."""
    is_float = jnp.issubdtype(a.dtype, jnp.floating)
    return tuple(a.shape), None if is_float else jnp.dtype(a.dtype).name


def _init(module: Llama, config: Any) -> Any:
    tok = jnp.zeros((1, 1), jnp.int32)
    cache = init_cache(config, 1, 1)
    return module.init(jax.random.PRNGKey(0), tok, tok, tok > -1, cache)["params"]


@functools.partial(jax.jit, static_argnames=("module", "spec"))
def _convert(module: Llama, spec: QuantSpec, params: Any) -> Any:
    """AQT CONVERT (one forward of one token freezes every weight's ints and scales), then
    the served params: each quantized float weight replaced by its stored ints and scales."""
    tok = jnp.zeros((1, 1), jnp.int32)
    cache = init_cache(module.config, 1, 1, module.dtype)
    _, variables = module.apply(
        {"params": params}, tok, tok, tok > -1, cache, mutable=[aqt_compat.COLLECTION]
    )
    frozen = {}
    for owner, qs in aqt_compat.frozen(variables[aqt_compat.COLLECTION]).items():
        assert owner[-1] == "matmul", owner
        frozen[owner[:-1]] = qs
    return _serve_params(spec, params, frozen)


def _serve_params(spec: QuantSpec, float_params: Any, frozen: dict) -> Any:
    """Replace each quantized float weight by its stored ints and scales."""

    def store(q_GgM: jax.Array, K: int, path: tuple[str, ...]) -> jax.Array:
        s = spec.head() if path[0] in ("embed_tokens", "lm_head") else spec
        return s.pack(q_GgM.reshape(-1, q_GgM.shape[-1])[:K].astype(jnp.int8))

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if path in frozen:
            q, scale = frozen[path]
            out = {k: v for k, v in node.items() if k not in ("kernel", "embedding")}
            K = node["kernel"].shape[0] if "kernel" in node else node["embedding"].shape[1]
            out["qweight"] = store(q, K, path)
            out["scale"] = scale.astype(SCALE_DTYPE)
            return out
        if isinstance(node, dict):
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        return node

    missing = [p for p in frozen if _get(float_params, p) is None]
    if missing:
        raise AssertionError(f"CONVERT froze layers missing from the params: {missing}")
    return walk(dict(float_params), ())


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


# ----------------------------------------------------------------------------- checkpoints


def _flatten(params: Any) -> dict[str, jax.Array]:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {".".join(str(p.key) for p in path): leaf for path, leaf in flat}


def save_quantized(model: Model, path: Any) -> pathlib.Path:
    """Write a quantized model: config.json (with `quantization_config`), model.safetensors
    (the served params under their Flax paths, e.g. `layers_0.mlp.up_proj.qweight`) and the
    tokenizer. `jaxspec.save` calls this for quantized models, `jaxspec.load` reads it back.
    """
    from safetensors.flax import save_file

    spec = quant_spec(model)
    if spec is None:
        raise ValueError("save_quantized wants a quantized model (see jaxspec.quantize)")
    if model.dense_cls.mode != "serve":
        raise ValueError("only served (mode='serve') models are saved; quantize() again")
    d = pathlib.Path(path)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, leaf in _flatten(model.params).items():
        arr = jnp.asarray(leaf)
        tensors[name] = arr.astype(jnp.int8) if arr.dtype == jnp.int4 else arr  # no int4 in st
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "jaxspec"})
    cfg = model.config.to_hf()
    cfg["dtype"] = jnp.dtype(model.dtype).name
    cfg["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "format_version": FORMAT_VERSION,
        **spec.to_json(),
        "scale_dtype": jnp.dtype(spec.scale_dtype).name,
        "layout": "see jaxspec/quant/quantize.py",
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(d))
    return d


def load_quantized(
    d: pathlib.Path,
    raw_cfg: dict[str, Any],
    *,
    dtype: Any = jnp.float32,
    tokenizer: Any = None,
    name: str = "",
) -> Model:
    """Read a directory written by `save_quantized` (no re-quantization)."""
    from safetensors import safe_open

    from jaxspec.nn.config import LlamaConfig

    q = raw_cfg["quantization_config"]
    if q.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{d}: unsupported {QUANT_METHOD} format {q.get('format_version')}")
    try:
        spec = QuantSpec(
            q["scheme"], q["group_size"], bool(q["embeddings"]), bool(q["packed"]),
            q.get("method", "rtn"), q.get("head_bits"), q.get("bits"),
            q.get("int4_layout", "rows"),  # files from before the tiled layout
            head_method=q.get("head_method"),  # files from before it: as the body
        )  # fmt: skip
        if spec.layout not in ("rows", "tiles"):
            raise KeyError(f"layout {spec.layout!r}")
        spec.weight_bits  # noqa: B018 (validates the scheme)
        if spec.method not in METHODS:
            raise KeyError(f"method {spec.method!r}")
        if spec.head_method not in (None, *HEAD_METHODS):
            raise KeyError(f"head_method {spec.head_method!r}")
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{d}: bad quantization_config {q}: {e}") from None
    config = LlamaConfig.from_hf(raw_cfg)
    shell = Model(config=config, params=None, dtype=dtype)
    module = _module(shell, spec, "serve")
    shapes = jax.eval_shape(lambda: _init(module, config))  # traced once: seconds via AQT
    expected = _flatten(shapes)
    f = d / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{d} has no model.safetensors")
    flat = {}
    with safe_open(str(f), framework="flax") as st:
        names = set(st.keys())
        for key, leaf in expected.items():
            if key not in names:
                raise CheckpointError(f"{d}: tensor {key!r} is missing")
            arr = st.get_tensor(key)
            if tuple(arr.shape) != tuple(leaf.shape):
                raise CheckpointError(
                    f"{d}: tensor {key!r} has shape {tuple(arr.shape)}, expected {leaf.shape}"
                )
            if _shape_and_int_dtype(arr) != _shape_and_int_dtype(leaf) and leaf.dtype != jnp.int4:
                raise CheckpointError(
                    f"{d}: tensor {key!r} has dtype {arr.dtype}, not {leaf.dtype}"
                )
            flat[key] = jnp.asarray(arr, leaf.dtype if leaf.dtype == jnp.int4 else arr.dtype)
        extra = sorted(names - set(expected))
        if extra:
            raise CheckpointError(f"{d}: unexpected tensors {extra[:5]}")
    if spec.weight_bits == 4 and spec.packed and spec.layout == "rows":
        spec = dataclasses.replace(spec, layout="tiles")  # what the int4 kernel reads
        module = _module(shell, spec, "serve")
        shapes = jax.eval_shape(lambda: _init(module, config))
        flat = _rows_to_tiles(flat, _flatten(shapes))
    treedef = jax.tree.structure(shapes)
    params = jax.tree.unflatten(treedef, [flat[k] for k in expected])
    return Model(
        config=config,
        params=params,
        tokenizer=tokenizer,
        dtype=dtype,
        name=name,
        dense_cls=module.dense_cls,
        embed_cls=module.embed_cls,
    )


def _rows_to_tiles(flat: dict[str, Any], tiled: dict[str, Any]) -> dict[str, Any]:
    """Packed int4 weights of the "rows" layout (`pack_int4`) in the "tiles" one (`pack_tiles`):
    the same ints, re-laid once at load."""
    out = dict(flat)
    for key, want in tiled.items():
        have = flat[key]
        if key.endswith("qweight") and tuple(have.shape) != tuple(want.shape):
            K = want.shape[1]
            out[key] = pack_tiles(unpack_int4(have, K))
    return out
