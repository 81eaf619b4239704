"""The quantized layers: `QuantDense` and `QuantEmbed`, drop-ins for `nn.Dense` and `nn.Embed`
whose matmuls run through AQT (train, convert) or on the stored ints (serve), and the
factories a quantized `Model` builds them with (`Model.dense_cls`, `Model.embed_cls`).

A served matmul runs the int4 or int8 kernel where it applies (`QuantSpec.use_kernel`), else
AQT's int dot; asymmetric weights (`scale * q + offset`) add the offset's share. The storage
of each param: `jaxspec.quant.quantize`'s doc.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxspec.kernels import int4 as int4kernel
from jaxspec.kernels import int8 as int8kernel
from jaxspec.kernels.int4_layout import take_tile_columns, unpack_int4, unpack_tiles
from jaxspec.nn.model import Llama, Model, init_cache
from jaxspec.quant import aqt_compat
from jaxspec.quant.spec import QuantSpec


def stored_ints(spec: QuantSpec, qweight: jax.Array, K: int, M: int) -> jax.Array:
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
    """float32 offset of the served form `scale * q + offset` (`jaxspec.quant.methods.offset`)."""
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
        return matmul(x_NK, served=(stored_ints(spec, qweight, K, M), scale), minimum=minimum)
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
        return stored_ints(self.spec, jnp.take(self.qweight, cols, axis=1), H, cols.shape[0])

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
    m = quant_llama(model, dataclasses.replace(spec, kernel=enabled), "serve")
    return model.with_params(model.params, dense_cls=m.dense_cls, embed_cls=m.embed_cls)


def quant_llama(model: Model, spec: QuantSpec, mode: str) -> Llama:
    """The Flax module of `model` with quantized layers of `spec` in `mode` ("train",
    "convert" or "serve")."""
    embed = EmbedFactory(spec, mode) if spec.embeddings else None
    return Llama(model.config, model.dtype, None, DenseFactory(spec, mode), embed)


def shape_and_int_dtype(a: Any) -> tuple[Any, ...]:
    """What the stored params of a SERVE module must match (float dtypes are free)."""
    is_float = jnp.issubdtype(a.dtype, jnp.floating)
    return tuple(a.shape), None if is_float else jnp.dtype(a.dtype).name


def initial_params(module: Llama, config: Any) -> Any:
    """`module`'s params as `init` declares them (call under `jax.eval_shape` for shapes)."""
    tok = jnp.zeros((1, 1), jnp.int32)
    cache = init_cache(config, 1, 1)
    return module.init(jax.random.PRNGKey(0), tok, tok, tok > -1, cache)["params"]
