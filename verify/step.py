"""The jitted multi-tenant verify step and chunked prefill over a KV slot pool (docs/design.md §5).

One padded batch: rows are sessions (any slot of the pool), columns are up to W positions.
Row r feeds `[last committed token, d_0 .. d_{n-1}]` at positions `P-1 .. P+n-1` of its slot
(P = committed length), gets `n+1` target distributions, applies the rule of docs/design.md §3 and
sets the slot's length to `P + emitted - 1` (the last committed token is fed next time).

A row with no drafts (a gamma-0 session: speculation off) gets one token, in either mode,
sampled from p at P with plain decoding's draw U(TARGET, P) (`_plain_tokens`). A batch of
such rows only runs at width 1 (`_decode_step`): one position per row, no rule, no q, a
plain decode step's work (the same logits bit for bit: the forward's rows are independent).

Draft q's of every encoding travel in one static layout: `q_full [R, W-1, V]` for rows with
`is_full`, else `q_ids/q_probs [R, W-1, k]` (sparse; onehot is ids = d, probs = 1); the rule
reads them as `DraftQ.mixed`, at the drafts and one position per row.

Attention reads the first A positions of each row's slot only (`attend`, a KV bucket that
covers every live row): the same bits as the whole slot, less KV read per step.

Sharding: a Mesh ("data", "model"): batch rows and pool slots over "data", attention heads
and MLP columns over "model" (`param_spec`). The same code runs on 1 device.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.compilation import trace_cache
from jaxspec.decoding.sampling import Purpose, SamplingParams, TokenCounts, sample_at
from jaxspec.decoding.verification import DraftQ, verify_block
from jaxspec.nn.model import KVCache, Llama

DATA, MODEL = "data", "model"


@flax.struct.dataclass(kw_only=True)
class VerifyBatch:
    """A padded batch (R rows, W columns). Filler rows have `live = False`.

    Fields: tokens `[R, W]` int32 (last committed token, then drafts); start `[R]` (P);
    num_draft `[R]`; slots `[R]`; live `[R]` bool; sync `[R]` bool; sampling
    (`[R]` each); keys `[R, 2]`; is_full `[R]`; q_full `[R, W-1, V]`; q_ids, q_probs
    `[R, W-1, k]`; attend `[A]` int32, `arange(A)`: the step reads the first A positions of
    each row's slot (A, a KV bucket, covers every live row's positions; its shape is what
    counts, so a new A is a new compiled shape like R and W);
    counts: each row's `TokenCounts` before its block (the penalties').
    """

    tokens: jax.Array
    start: jax.Array
    num_draft: jax.Array
    slots: jax.Array
    live: jax.Array
    sync: jax.Array
    sampling: SamplingParams
    keys: jax.Array
    is_full: jax.Array
    q_full: jax.Array
    q_ids: jax.Array
    q_probs: jax.Array
    attend: jax.Array
    counts: TokenCounts | None = None


def param_spec(path: tuple[str, ...], ndim: int) -> P:
    """Where a parameter lives on the ("data", "model") mesh: Megatron-style columns/rows."""
    name = "/".join(path)
    if ndim == 2 and any(k in name for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
        return P(None, MODEL)  # [in, out]: output columns split
    if ndim == 2 and any(k in name for k in ("o_proj", "down_proj")):
        return P(MODEL, None)  # [in, out]: input rows split
    if ndim == 1 and any(k in name for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
        return P(MODEL)
    return P()


def shard_params(params: Any, mesh: Mesh) -> Any:
    def put(path, x):
        keys = tuple(getattr(p, "key", str(p)) for p in path)
        return jax.device_put(x, NamedSharding(mesh, param_spec(keys, x.ndim)))

    return jax.tree_util.tree_map_with_path(put, params)


def cache_sharding(mesh: Mesh) -> KVCache:
    kv = NamedSharding(mesh, P(None, DATA, None, MODEL, None))  # [L, N, S, Hkv, D]
    return KVCache(k=kv, v=kv, lengths=NamedSharding(mesh, P(DATA)))


def verify_step_fn(
    module: Llama, params: Any, cache: KVCache, batch: VerifyBatch
) -> tuple[KVCache, dict[str, jax.Array]]:
    """The step itself (pure); `make_verify_step` jits it with donation and shardings."""
    W = batch.tokens.shape[1]
    if W == 1:  # no row can carry a draft: a decode step
        return _decode_step(module, params, cache, batch)
    positions = batch.start[:, None] - 1 + jnp.arange(W)[None, :]
    valid = batch.live[:, None] & (jnp.arange(W)[None, :] <= batch.num_draft[:, None])
    logits, cache = module.apply(
        {"params": params}, batch.tokens, positions, valid, cache, batch.slots,
        batch.attend.shape[0],
    )  # fmt: skip
    num_draft = jnp.where(batch.live, batch.num_draft, 0)
    # A block without drafts (gamma 0: speculation off) always gets its token, in pipelined
    # mode too (0 drafts + a bonus: the rule's bonus is a sample of p at `start`) ...
    bonus = batch.sync | (num_draft == 0)
    q = DraftQ.mixed(batch.q_full, batch.is_full, batch.q_ids, batch.q_probs)
    res = verify_block(
        batch.tokens[:, 1:], num_draft, logits, q, batch.sampling, batch.keys, batch.start, bonus,
        batch.counts,
    )  # fmt: skip
    tokens = _plain_tokens(res.tokens, batch.live & (num_draft == 0), logits[:, 0], batch)
    # Commit everything emitted; the host may cut at a stop token and roll back further.
    new_len = (batch.start + res.num_emitted - 1).astype(jnp.int32)
    rows = jnp.where(batch.live, batch.slots, cache.num_rows)  # filler rows: dropped
    cache = cache.replace(lengths=cache.lengths.at[rows].set(new_len, mode="drop"))
    out = {
        "tokens": tokens,
        "num_accepted": res.num_accepted,
        "num_emitted": res.num_emitted,
        "accepted": res.accepted,
    }
    return cache, out


def _decode_step(
    module: Llama, params: Any, cache: KVCache, batch: VerifyBatch
) -> tuple[KVCache, dict[str, jax.Array]]:
    """`verify_step_fn` at width 1 (every row a block without drafts): the forward of each
    row's last committed token at P-1 and its token drawn as `_plain_tokens` draws it, with
    the outputs of the rule's layout (K = 0 drafts, one token emitted per row)."""
    R = batch.tokens.shape[0]
    positions = batch.start[:, None] - 1
    logits, cache = module.apply(
        {"params": params}, batch.tokens, positions, batch.live[:, None], cache, batch.slots,
        batch.attend.shape[0],
    )  # fmt: skip
    tok_R = sample_at(
        logits[:, 0], batch.sampling, batch.keys, batch.start, Purpose.TARGET, batch.counts
    )
    rows = jnp.where(batch.live, batch.slots, cache.num_rows)  # filler rows: dropped
    cache = cache.replace(lengths=cache.lengths.at[rows].set(batch.start, mode="drop"))
    out = {
        "tokens": tok_R[:, None].astype(jnp.int32),
        "num_accepted": jnp.zeros(R, jnp.int32),
        "num_emitted": jnp.ones(R, jnp.int32),
        "accepted": jnp.zeros((R, 0), bool),
    }
    return cache, out


def _plain_tokens(
    tokens_RW: jax.Array, plain_R: jax.Array, logits_RV: jax.Array, batch: VerifyBatch
) -> jax.Array:
    """... drawn as plain decoding draws it: `sample_at(p, U(TARGET, start))`, the draw of
    `jaxspec.generate` without a draft, so a gamma-0 session's tokens are plain decoding's
    (not the BONUS draw, which would give another, equally distributed, sequence). Skipped
    (`lax.cond`) when no row of the batch is such a block."""

    def sampled() -> jax.Array:
        tok = sample_at(
            logits_RV, batch.sampling, batch.keys, batch.start, Purpose.TARGET, batch.counts
        )
        return tokens_RW.at[:, 0].set(jnp.where(plain_R, tok, tokens_RW[:, 0]))

    return jax.lax.cond(jnp.any(plain_R), sampled, lambda: tokens_RW)


def prefill_fn(
    module: Llama,
    params: Any,
    cache: KVCache,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    slots: jax.Array,
) -> KVCache:
    """Write the KV of a chunk of prompt tokens `[R, C]` into `slots` (logits unused)."""
    _, cache = module.apply({"params": params}, tokens, positions, valid, cache, slots)
    return cache


@functools.cache
def make_verify_step(module: Llama, mesh: Mesh | None = None):
    """The jitted step for `module` (cache donated; sharded over `mesh` when given)."""
    if mesh is None:  # traces kept between runs where configured (jaxspec.compilation.trace_cache)
        return trace_cache.jit(functools.partial(verify_step_fn, module), donate_argnums=(1,))
    cs = cache_sharding(mesh)
    return jax.jit(
        functools.partial(verify_step_fn, module),
        donate_argnums=(1,),
        out_shardings=(cs, NamedSharding(mesh, P(DATA))),
    )


@functools.cache
def make_prefill(module: Llama, mesh: Mesh | None = None):
    if mesh is None:
        return trace_cache.jit(functools.partial(prefill_fn, module), donate_argnums=(1,))
    return jax.jit(
        functools.partial(prefill_fn, module),
        donate_argnums=(1,),
        out_shardings=cache_sharding(mesh),
    )


def make_mesh(data: int = 1, model: int = 1, devices: list | None = None) -> Mesh:
    devs = np.asarray(devices if devices is not None else jax.devices()[: data * model])
    if devs.size != data * model:
        raise ValueError(f"need {data * model} devices for a {data}x{model} mesh, have {devs.size}")
    return Mesh(devs.reshape(data, model), (DATA, MODEL))
