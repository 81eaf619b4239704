"""A Llama-family decoder in Flax linen with a per-row KV cache.

One forward serves prefill, single-token decode and multi-token verification: it takes
tokens `[B, T]` with explicit absolute positions `[B, T]` and a validity mask, writes the
keys/values of every valid token at index = its position in the row's cache slot, and lets
each query at position p attend to cache indices `<= p` of its slot:

    slot row (S = max length)   0 1 2 3 4 5 6 7
    committed (length = 5)      k k k k k . . .
    this call, positions 5..7             n n n     <- written, then attended
    query at position 6 sees    x x x x x x x .

Rolling a row back is lowering its length: stale entries past it are never attended by a
query at a lower position and are overwritten by the next write. Padded tokens (valid=False)
are written nowhere (their index is pushed out of range and the scatter drops it).

Matrix multiplies go through an injectable `dot_general_cls` (quantization plugs in there).
Two more hooks let a quantized model replace whole layers: `dense_cls` builds every linear
layer (q/k/v/o, MLP, untied lm_head) with `nn.Dense`'s signature and `embed_cls` builds the
token embedding with `nn.Embed`'s (`__call__` and `attend`); both must be hashable, since
they are part of the static module. `jaxspec.quantize` uses them so that a served model
holds packed integer weights and no float kernel.

Gemma 3's switches (`LlamaConfig.is_gemma`) change the block, not the cache: a local layer
writes every position like a global one, and its queries only look back `sliding_window`
positions (a lower bound on the visible indices, in the kernel and in the einsum form), so
rollback and the verifier's slot pool work unchanged; the window costs no memory saving.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from jaxspec.kernels import attention as attention_kernel
from jaxspec.kernels import dense as dense_kernel
from jaxspec.nn.config import LlamaConfig, rope_inv_freq

ACTIVATIONS = {
    "silu": nn.silu,
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
}

Params = Any

# A float model's linear layers: nn.Dense whose matmul is `jaxspec.kernels.dense.dot_general`
# (the batch-invariant CPU kernel where it is enabled, XLA's dot elsewhere). One object, so the
# static module stays hashable and equal across calls.
FloatDense = functools.partial(nn.Dense, dot_general=dense_kernel.dot_general)


def _dense(kernels: bool) -> Any:
    return FloatDense if kernels else nn.Dense


@flax.struct.dataclass(kw_only=True)
class KVCache:
    """Keys and values of every layer for a pool of N rows (sessions) of S positions.

    Fields:
      k: `[L, N, S, Hkv, D]` keys (RoPE applied), compute dtype.
      v: `[L, N, S, Hkv, D]` values.
      lengths: `[N]` int32, number of positions written and kept per row.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def num_rows(self) -> int:
        return self.k.shape[1]

    def rollback(self, rows: Int[Array, " R"], lengths: Int[Array, " R"]) -> KVCache:
        """Lower the lengths of `rows` to `lengths` (never raises one)."""
        new = jnp.minimum(self.lengths[rows], lengths.astype(jnp.int32))
        return self.replace(lengths=self.lengths.at[rows].set(new))


def init_cache(config: LlamaConfig, rows: int, max_len: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty cache of `rows` slots with room for `max_len` positions each."""
    shape = (config.num_hidden_layers, rows, max_len, config.num_key_value_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros(rows, jnp.int32)
    )


def _acc(dtype: Any) -> Any:
    """Accumulation dtype for norms, softmax and logits: float32, or float64 in x64 tests."""
    return jnp.promote_types(dtype, jnp.float32)


def _tree_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis in one fixed pairwise order (zero-padded to a power of two, then
    halves added), as explicit elementwise adds: XLA:CPU's own reduction changes a row's
    rounding with the number of rows, this does not (batch invariance, `jaxspec.kernels.dense`)."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x[..., 0]


class RMSNorm(nn.Module):
    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x32 = x.astype(_acc(self.dtype))
        mean = _tree_sum(x32 * x32)[..., None] / x.shape[-1]
        x32 = x32 * jax.lax.rsqrt(mean + self.eps)
        return scale.astype(self.dtype)[(None,) * (x.ndim - 1)] * x32.astype(self.dtype)


def _rope(x_BTHD: jax.Array, cos_BTD: jax.Array, sin_BTD: jax.Array) -> jax.Array:
    """HF `rotate_half` RoPE: halves of the head dim are the (real, imag) pairs."""
    half = x_BTHD.shape[-1] // 2
    rot = jnp.concatenate([-x_BTHD[..., half:], x_BTHD[..., :half]], axis=-1)
    return x_BTHD * cos_BTD[:, :, None, :] + rot * sin_BTD[:, :, None, :]


class LayerPart(nn.Module):
    """The fields every part of a decoder layer (attention, MLP, the layer itself) takes, in
    this order: the config, the activations' dtype, how linear layers are built (`Llama`'s
    doc), and whether the CPU kernels run where enabled (`jaxspec.kernels`)."""

    config: LlamaConfig
    dtype: Any
    dot_general_cls: Any = None
    dense_cls: Any = None
    kernels: bool = True


class Attention(LayerPart):
    window: int | None = None  # sliding window (local layers), None: every earlier position

    @nn.compact
    def __call__(
        self,
        x_BTE: jax.Array,
        cos_BTD: jax.Array,
        sin_BTD: jax.Array,
        positions_BT: jax.Array,
        write_BT: jax.Array,
        k_all_LNSKD: jax.Array,
        v_all_LNSKD: jax.Array,
        layer: int,
        slots_B: jax.Array | None,
        kv_len: int | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Writes this layer's new K/V into the whole stacked cache in place (a scatter on
        the donated buffer: no per-layer slice or re-stack copies the pool) and attends over
        the first `kv_len` positions of each slot (all of it when None)."""
        c = self.config
        nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        dense = functools.partial(
            self.dense_cls or _dense(self.kernels),
            dtype=self.dtype,
            dot_general_cls=self.dot_general_cls,
        )
        B, T, _ = x_BTE.shape
        q = dense(nq * d, use_bias=c.qkv_bias, name="q_proj")(x_BTE).reshape(B, T, nq, d)
        k = dense(nkv * d, use_bias=c.qkv_bias, name="k_proj")(x_BTE).reshape(B, T, nkv, d)
        v = dense(nkv * d, use_bias=c.qkv_bias, name="v_proj")(x_BTE).reshape(B, T, nkv, d)
        if c.qk_norm:
            q = RMSNorm(c.rms_norm_eps, self.dtype, name="q_norm")(q)
            k = RMSNorm(c.rms_norm_eps, self.dtype, name="k_norm")(k)
        q, k = _rope(q, cos_BTD, sin_BTD), _rope(k, cos_BTD, sin_BTD)
        if c.query_pre_attn_scalar and c.query_pre_attn_scalar != d:
            # the kernels divide scores by sqrt(d); the model wants sqrt(query_pre_attn_scalar)
            q = q * np.float32(np.sqrt(d / c.query_pre_attn_scalar)).astype(self.dtype)

        rows_B = jnp.arange(B) if slots_B is None else slots_B
        k_all_LNSKD = k_all_LNSKD.at[layer, rows_B[:, None], write_BT].set(
            k.astype(k_all_LNSKD.dtype), mode="drop"
        )
        v_all_LNSKD = v_all_LNSKD.at[layer, rows_B[:, None], write_BT].set(
            v.astype(v_all_LNSKD.dtype), mode="drop"
        )
        S = k_all_LNSKD.shape[2] if kv_len is None else kv_len
        q_BTKGD = q.reshape(B, T, nkv, nq // nkv, d)
        out_BTKGD = self._attend(q_BTKGD, k_all_LNSKD, v_all_LNSKD, layer, rows_B, slots_B,
                                 positions_BT, S)  # fmt: skip
        out = dense(c.hidden_size, use_bias=c.o_bias, name="o_proj")(out_BTKGD.reshape(B, T, -1))
        return out, k_all_LNSKD, v_all_LNSKD

    def _attend(self, q_BTKGD, k_all_LNSKD, v_all_LNSKD, layer, rows_B, slots_B, pos_BT, S):
        """Attention over the first S positions of each row's slot (the last `window` up to
        each query's position in a local layer): on the batch-invariant kernel where enabled
        (reading a float32 or bfloat16 cache in place), else XLA's einsum form."""
        kernel = self.kernels and dense_kernel.enabled()
        if kernel and k_all_LNSKD.dtype in attention_kernel.CACHE_DTYPES:
            out = attention_kernel.cache_attention(
                q_BTKGD, k_all_LNSKD, v_all_LNSKD, layer, rows_B, pos_BT, S, self.window
            )
            return out.astype(self.dtype)
        if slots_B is None:
            keys_BSKD, vals_BSKD = k_all_LNSKD[layer, :, :S], v_all_LNSKD[layer, :, :S]
        else:
            keys_BSKD, vals_BSKD = k_all_LNSKD[layer, slots_B, :S], v_all_LNSKD[layer, slots_B, :S]
        if kernel and self.window is None:
            out = attention_kernel.attention(q_BTKGD, keys_BSKD, vals_BSKD, pos_BT)
            return out.astype(self.dtype)
        visible_BTS = attention_kernel.visible(S, pos_BT, self.window)
        return attention_kernel.einsum_attention(
            q_BTKGD, keys_BSKD, vals_BSKD, visible_BTS, self.dtype
        )


class MLP(LayerPart):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        dense = functools.partial(
            self.dense_cls or _dense(self.kernels),
            use_bias=c.mlp_bias,
            dtype=self.dtype,
            dot_general_cls=self.dot_general_cls,
        )
        gate = dense(c.intermediate_size, name="gate_proj")(x)
        up = dense(c.intermediate_size, name="up_proj")(x)
        return dense(c.hidden_size, name="down_proj")(ACTIVATIONS[c.hidden_act](gate) * up)


class DecoderLayer(LayerPart):
    @nn.compact
    def __call__(self, x, cos, sin, positions, write, k_cache, v_cache, layer, slots, kv_len):
        """Llama: x + attn(norm(x)), then + mlp(norm(.)); with `sandwich_norms` (Gemma) each
        branch's output is normed too, and HF's `post_attention_layernorm` is that norm (the
        MLP's input norm is `pre_feedforward_layernorm`)."""
        c = self.config
        norm = functools.partial(RMSNorm, c.rms_norm_eps, self.dtype)
        h = norm(name="input_layernorm")(x)
        h, k_cache, v_cache = Attention(
            c, self.dtype, self.dot_general_cls, self.dense_cls, self.kernels, c.window(layer),
            name="self_attn",
        )(h, cos, sin, positions, write, k_cache, v_cache, layer, slots, kv_len)  # fmt: skip
        mlp = MLP(c, self.dtype, self.dot_general_cls, self.dense_cls, self.kernels, name="mlp")
        if not c.sandwich_norms:
            x = x + h
            return x + mlp(norm(name="post_attention_layernorm")(x)), k_cache, v_cache
        x = x + norm(name="post_attention_layernorm")(h)
        h = mlp(norm(name="pre_feedforward_layernorm")(x))
        return x + norm(name="post_feedforward_layernorm")(h), k_cache, v_cache


class Llama(nn.Module):
    """The decoder. `__call__` returns logits `[B, T, V]` (float32, or float64 for a float64
    model) and the updated cache."""

    config: LlamaConfig
    dtype: Any = jnp.float32
    dot_general_cls: Any = None
    dense_cls: Any = None  # builds linear layers (default nn.Dense), see the module doc
    embed_cls: Any = None  # builds the token embedding (default nn.Embed)
    # Float matmuls, attention and the tied head on `jaxspec.kernels`' batch-invariant CPU
    # kernels where they are enabled (False: XLA's own ops everywhere; benchmarks, tests).
    kernels: bool = True

    @nn.compact
    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        valid_BT: jax.Array,
        cache: KVCache,
        slots_B: jax.Array | None = None,
        kv_len: int | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """`kv_len` (static): attend over the first `kv_len` positions of each slot only; every
        query position must be below it (the verifier buckets it by the batch's live length)."""
        c = self.config
        embed_cls = self.embed_cls or nn.Embed
        embed = embed_cls(c.vocab_size, c.hidden_size, dtype=self.dtype, name="embed_tokens")
        x = embed(tokens_BT)
        if c.embed_scale:  # HF: sqrt(hidden) rounded to the weights' dtype
            x = x * jnp.asarray(np.float32(np.sqrt(c.hidden_size))).astype(self.dtype)

        acc = _acc(self.dtype)
        rope = {False: self._rope_table(positions_BT, acc, local=False)}
        if any(c.window(i) for i in range(c.num_hidden_layers)):
            rope[True] = self._rope_table(positions_BT, acc, local=True)

        S = cache.max_len
        write_BT = jnp.where(valid_BT, positions_BT, S)  # out of range -> scatter drops it
        k_all, v_all = cache.k, cache.v
        for i in range(c.num_hidden_layers):
            layer = DecoderLayer(
                c, self.dtype, self.dot_general_cls, self.dense_cls, self.kernels,
                name=f"layers_{i}",
            )  # fmt: skip
            cos, sin = rope[c.window(i) is not None]
            x, k_all, v_all = layer(
                x, cos, sin, positions_BT, write_BT, k_all, v_all, i, slots_B, kv_len
            )
        x = RMSNorm(c.rms_norm_eps, self.dtype, name="norm")(x)
        if c.tie_word_embeddings and self.embed_cls is None:
            # x [B, T, E] . embedding [V, E] contracted on E, as the table is stored: Flax's
            # `attend` (a dot with embedding.T) made XLA:CPU copy the whole transposed table
            # every step (10 ms of a 33 ms SmolLM2 decode step, measured with jax.profiler).
            table = embed.embedding.astype(self.dtype)
            with jax.named_scope("lm_head"):  # profiles find the tied head by this name
                logits = dense_kernel.head(x, table, use_kernel=self.kernels)
        elif c.tie_word_embeddings:
            logits = embed.attend(x)
        else:
            logits = (self.dense_cls or _dense(self.kernels))(
                c.vocab_size,
                use_bias=False,
                dtype=self.dtype,
                dot_general_cls=self.dot_general_cls,
                name="lm_head",
            )(x)

        rows = jnp.arange(tokens_BT.shape[0]) if slots_B is None else slots_B
        written = jnp.max(jnp.where(valid_BT, positions_BT + 1, 0), axis=1)
        lengths = cache.lengths.at[rows].max(written.astype(jnp.int32))
        new_cache = KVCache(k=k_all, v=v_all, lengths=lengths)
        return logits.astype(acc), new_cache

    def _rope_table(self, positions_BT: jax.Array, acc: Any, local: bool) -> tuple[Any, Any]:
        """cos, sin `[B, T, D]` of every position (a local layer's base when `local`)."""
        inv_freq = np.asarray(rope_inv_freq(self.config, local), np.float32).astype(acc)
        angles_BTd = positions_BT.astype(acc)[..., None] * inv_freq[None, None, :]  # HF: f32
        angles_BTD = jnp.concatenate([angles_BTd, angles_BTd], axis=-1)
        return jnp.cos(angles_BTD).astype(self.dtype), jnp.sin(angles_BTD).astype(self.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """A loaded model: static config, weights (a jit argument, never static), tokenizer.

    `module` is hashable and goes to `static_argnames`; `params` is a pytree of arrays.
    """

    config: LlamaConfig
    params: Params
    tokenizer: Any = None
    dtype: Any = jnp.float32
    dot_general_cls: Any = None
    name: str = ""
    dense_cls: Any = None  # set by `jaxspec.quantize` (see `Llama`)
    embed_cls: Any = None
    kernels: bool = True  # see `Llama.kernels`

    @property
    def module(self) -> Llama:
        return Llama(
            self.config, self.dtype, self.dot_general_cls, self.dense_cls, self.embed_cls,
            self.kernels,
        )  # fmt: skip

    def nbytes(self) -> int:
        """Resident bytes of the weights (packed int4 counts its real bytes: two per uint8)."""
        return int(sum(x.nbytes for x in jax.tree.leaves(self.params)))

    def num_params(self) -> int:
        return int(sum(x.size for x in jax.tree.leaves(self.params)))

    def init_cache(self, rows: int, max_len: int) -> KVCache:
        return init_cache(self.config, rows, max_len, self.dtype)

    def __call__(
        self,
        tokens: Int[Array, "B T"],
        positions: Int[Array, "B T"],
        cache: KVCache,
        valid: Bool[Array, "B T"] | None = None,
        slots: Int[Array, " B"] | None = None,
    ) -> tuple[Float[Array, "B T V"], KVCache]:
        """One forward (jitted): logits `[B, T, V]` float32 and the cache with KV written."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if valid is None:
            valid = jnp.ones(tokens.shape, bool)
        return forward(
            self.module, self.params, tokens, jnp.asarray(positions), valid, cache, slots
        )

    def with_params(self, params: Params, **changes: Any) -> Model:
        return dataclasses.replace(self, params=params, **changes)


@functools.partial(jax.jit, static_argnames=("module",))
def forward(
    module: Llama,
    params: Params,
    tokens: Int[Array, "B T"],
    positions: Int[Array, "B T"],
    valid: Bool[Array, "B T"],
    cache: KVCache,
    slots: Int[Array, " B"] | None = None,
) -> tuple[Float[Array, "B T V"], KVCache]:
    """Pure jitted forward of `module` (see the module docstring for the cache contract)."""
    return module.apply({"params": params}, tokens, positions, valid, cache, slots)


def param_shapes(config: LlamaConfig) -> Params:
    """The param tree `init_params` makes (float32 `jax.ShapeDtypeStruct` leaves), read from
    the config alone: `jaxspec.load` checks a checkpoint's tensors against it without tracing
    the model (`jax.eval_shape(init_params)` took 1.7 s of a warm 2.5 s SmolLM2 load).
    tests/test_model.py holds it equal to that `eval_shape` for every architecture variant."""
    c = config
    H, F, V = c.hidden_size, c.intermediate_size, c.vocab_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim

    def arr(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def dense(n_in: int, n_out: int, bias: bool) -> dict[str, Any]:
        return {"kernel": arr(n_in, n_out), **({"bias": arr(n_out)} if bias else {})}

    def layer() -> dict[str, Any]:
        attn = {
            "q_proj": dense(H, q, c.qkv_bias),
            "k_proj": dense(H, kv, c.qkv_bias),
            "v_proj": dense(H, kv, c.qkv_bias),
            "o_proj": dense(q, H, c.o_bias),
        }
        if c.qk_norm:
            attn |= {"q_norm": {"scale": arr(c.head_dim)}, "k_norm": {"scale": arr(c.head_dim)}}
        sandwich = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        return {
            "input_layernorm": {"scale": arr(H)},
            "self_attn": attn,
            "post_attention_layernorm": {"scale": arr(H)},
            **({n: {"scale": arr(H)} for n in sandwich} if c.sandwich_norms else {}),
            "mlp": {
                "gate_proj": dense(H, F, c.mlp_bias),
                "up_proj": dense(H, F, c.mlp_bias),
                "down_proj": dense(F, H, c.mlp_bias),
            },
        }

    out: dict[str, Any] = {"embed_tokens": {"embedding": arr(V, H)}, "norm": {"scale": arr(H)}}
    out |= {f"layers_{i}": layer() for i in range(c.num_hidden_layers)}
    if not c.tie_word_embeddings:
        out["lm_head"] = dense(H, V, False)
    return out


def init_params(config: LlamaConfig, seed: int = 0, dtype: Any = jnp.float32) -> Params:
    """Random weights (for tests and training from scratch), std 0.02 like HF's init."""
    module = Llama(config, dtype)
    cache = init_cache(config, 1, 1, dtype)
    tok = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.PRNGKey(0), tok, tok, tok > -1, cache)["params"]
    )
    leaves, treedef = jax.tree.flatten_with_path(shapes)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = []
    for (path, shape), key in zip(leaves, keys, strict=True):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            out.append(jnp.ones(shape.shape, dtype))
        elif "bias" in name:
            out.append(jnp.zeros(shape.shape, dtype))
        else:
            out.append((0.02 * jax.random.normal(key, shape.shape)).astype(dtype))
    return jax.tree.unflatten(treedef, out)
