"""The edge drafter: gamma draft tokens per call from the (W4A16) draft model, own KV cache.

State per row (session): its context — prompt, committed tokens, then its own drafts not
rolled back — and the KV cache of those positions. One `draft` call appends gamma drafts:

    context      t0 t1 .. t(n-2) t(n-1) | d0  d1 .. d(g-1)      length n -> n + g
    fed          (t(n-2) if its KV is missing) t(n-1)  d0 .. d(g-2)    (one jitted lax.scan)
    draft at p   sampled from warp(logits) with U(key, p, DRAFT)   (docs/design.md §2)

Rolling back is lowering `length` and the cache's length (no KV is copied or cleared;
stale entries are masked, then overwritten). Since every draw is keyed by its absolute
position, a rolled-back position re-drafts exactly as before given the same prefix, and a
drafter rolled back to a committed prefix drafts what a fresh drafter built on that prefix
drafts. The first fed token re-feeds `t(n-2)` when its KV is missing: after a fully accepted
block the bonus token follows a draft the model never fed (as in `jaxspec.decoding.speculative`).

Precondition (true for the verify protocol: roll back, then append the one correction or
bonus token): the KV cache lags the context by at most two positions when `draft` is called.
Rows must have room: `length + gamma <= max_len`.

Penalties read the context itself: its first `prompt_len` tokens are the prompt, the rest up
to `length` the output (committed tokens, then drafts in flight), and each draft of a block
also counts the block's earlier drafts (`draft_block`). Rolling back the length rolls the
counts back with it.

An edge session's round is one call, `draft_round`: roll back, append the verifier's token
and draft the next block, with the state donated, so the KV cache is written in place
rather than copied once per call (three copies a round when the three ran apart).

The per-step sampling is `jaxspec.decoding.speculative.draft_q_for`, so the q returned for each
encoding (full / sparse top-k / onehot) is exactly the distribution the draft was drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.ckpts.checkpoint import load
from jaxspec.compilation import trace_cache
from jaxspec.compilation.shapes import bucket
from jaxspec.decoding.sampling import SamplingParams, TokenCounts, cond
from jaxspec.decoding.speculative import draft_block
from jaxspec.decoding.verification import DraftQ
from jaxspec.nn.model import KVCache, Llama, Model, init_cache
from jaxspec.protocol import DraftSpec, InvalidArgument
from jaxspec.quant.layers import quant_spec
from jaxspec.quant.quantize import quantize as quantize_model


@flax.struct.dataclass(kw_only=True)
class DrafterState:
    """The drafter's rows (N sessions, S positions each).

    Fields:
      tokens: `[N, S]` int32, each row's context: prompt, committed tokens, then its own
        drafts; entries at index >= `length` are stale.
      length: `[N]` int32, the context length; the next draft goes to position `length`.
      cache: the draft model's `KVCache` `[L, N, S, Hkv, D]`; `cache.lengths[N]` counts the
        positions whose KV is written (at most `length`).
      prompt_len: `[N]` int32, the prompt's length (the penalties count what follows as
        output).
    """

    tokens: jax.Array
    length: jax.Array
    cache: KVCache
    prompt_len: jax.Array


@flax.struct.dataclass(kw_only=True)
class DraftBatch:
    """What one `draft` call produced: a block of drafts for every row (the wire's one-block
    message is `jaxspec.protocol.DraftBlock`, which the session builds from one row of this).

    Fields:
      start: `[N]` int32, absolute position of the first draft (the context length before).
      tokens: `[N, gamma]` int32 drafts, -1 in rows that were not live.
      q: the distributions the drafts were sampled from (`DraftQ`, batch-major `[N, gamma, ...]`).
    """

    start: jax.Array
    tokens: jax.Array
    q: DraftQ


def init_state(model: Model, rows: int, max_len: int) -> DrafterState:
    """Empty rows (length 0) with room for `max_len` positions each."""
    return DrafterState(
        tokens=jnp.zeros((rows, max_len), jnp.int32),
        length=jnp.zeros(rows, jnp.int32),
        cache=init_cache(model.config, rows, max_len, model.dtype),
        prompt_len=jnp.zeros(rows, jnp.int32),
    )


def _prefill(
    module: Llama,
    params: Any,
    state: DrafterState,
    rows_R: jax.Array,
    prompts_RT: jax.Array,
    lengths_R: jax.Array,
    prompt_len_R: jax.Array,
) -> DrafterState:
    """Reset `rows` to the prompts (right-padded `[R, T]`, `lengths` >= 1) and write the KV of
    every prompt position but the last (the first `draft` feeds it); the penalties count the
    context after `prompt_len` as output."""
    R, T = prompts_RT.shape
    cols_RT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (R, T))
    valid_RT = cols_RT < lengths_R[:, None]
    S = state.tokens.shape[1]
    write = jnp.where(valid_RT, cols_RT, S)
    tokens = state.tokens.at[rows_R[:, None], write].set(prompts_RT, mode="drop")
    cache = state.cache.replace(lengths=state.cache.lengths.at[rows_R].set(0))
    kv_valid = cols_RT < (lengths_R - 1)[:, None]
    _, cache = module.apply({"params": params}, prompts_RT, cols_RT, kv_valid, cache, rows_R)
    length = state.length.at[rows_R].set(lengths_R.astype(jnp.int32))
    prompt_len = state.prompt_len.at[rows_R].set(prompt_len_R.astype(jnp.int32))
    return DrafterState(tokens=tokens, length=length, cache=cache, prompt_len=prompt_len)


prefill = trace_cache.jit(_prefill, static_argnames=("module",))


# `prefill` with `state` donated: a pool's rows are reset in place (no copy of the whole
# pool's cache). Both keep the same trace (donation is applied as it loads).
prefill_in_place = trace_cache.jit(
    _prefill, static_argnames=("module",), donate_argnames=("state",)
)


def _rolled_back(state: DrafterState, rows_R: jax.Array, lengths_R: jax.Array) -> DrafterState:
    """`rollback`'s body (traced): a change of lengths, no KV copied or cleared."""
    new = jnp.minimum(state.length[rows_R], lengths_R.astype(jnp.int32))
    return state.replace(
        length=state.length.at[rows_R].set(new), cache=state.cache.rollback(rows_R, new)
    )


def _appended(
    state: DrafterState, rows_R: jax.Array, tokens_RK: jax.Array, counts_R: jax.Array
) -> DrafterState:
    """`append`'s body (traced)."""
    K = tokens_RK.shape[1]
    cols = jnp.arange(K, dtype=jnp.int32)[None, :]
    start = state.length[rows_R]
    write = jnp.where(cols < counts_R[:, None], start[:, None] + cols, state.tokens.shape[1])
    tokens = state.tokens.at[rows_R[:, None], write].set(tokens_RK.astype(jnp.int32), mode="drop")
    length = state.length.at[rows_R].set(start + counts_R.astype(jnp.int32))
    return state.replace(tokens=tokens, length=length)


@trace_cache.jit
def rollback(state: DrafterState, rows_R: jax.Array, lengths_R: jax.Array) -> DrafterState:
    """Lower the context of `rows` to `lengths` (never raises one); KV beyond is dropped."""
    return _rolled_back(state, rows_R, lengths_R)


@trace_cache.jit
def append(
    state: DrafterState, rows_R: jax.Array, tokens_RK: jax.Array, counts_R: jax.Array
) -> DrafterState:
    """Append the first `counts[r]` of `tokens[r]` (e.g. a correction or bonus token) to the
    context of `rows[r]`; their KV is written by the next `draft`."""
    return _appended(state, rows_R, tokens_RK, counts_R)


@trace_cache.jit(static_argnames=("module", "spec"))
def draft(
    module: Llama,
    params: Any,
    state: DrafterState,
    sampling: SamplingParams,
    keys_N2: jax.Array,
    live_N: jax.Array,
    *,
    spec: DraftSpec,
) -> tuple[DrafterState, DraftBatch]:
    """Draft `spec.gamma` tokens for every live row (module doc); returns the state with the
    drafts appended to the live rows' contexts, and the drafts."""
    return _drafted(module, params, state, sampling, keys_N2, live_N, spec)


@trace_cache.jit(static_argnames=("module", "spec"), donate_argnames=("state",))
def draft_round(
    module: Llama,
    params: Any,
    state: DrafterState,
    keep_N: jax.Array,
    next_NK: jax.Array,
    count_N: jax.Array,
    sampling: SamplingParams,
    keys_N2: jax.Array,
    live_N: jax.Array,
    *,
    spec: DraftSpec,
) -> tuple[DrafterState, DraftBatch]:
    """One edge round for every row in one call: `rollback` to `keep` (a change of lengths),
    `append` the first `count` of `next` (the verifier's correction or bonus token), then
    `draft`. The same state and drafts as those three calls in turn, but `state` is donated:
    its buffers become the result's (the KV cache is updated in place, never copied), so
    the caller must not use `state` again."""
    rows = jnp.arange(state.tokens.shape[0])
    state = _appended(_rolled_back(state, rows, keep_N), rows, next_NK, count_N)
    return _drafted(module, params, state, sampling, keys_N2, live_N, spec)


def _drafted(
    module: Llama,
    params: Any,
    state: DrafterState,
    sampling: SamplingParams,
    keys_R2: jax.Array,
    live_R: jax.Array,
    spec: DraftSpec,
    rows_R: jax.Array | None = None,
) -> tuple[DrafterState, DraftBatch]:
    """`draft`'s body (traced), for every row or only `rows` (a pool's rows with a block to
    draft: `sampling`, `keys` and `live` are theirs, the other rows are left as they are)."""
    S = state.tokens.shape[1]
    gamma = spec.gamma
    rows = jnp.arange(state.tokens.shape[0]) if rows_R is None else rows_R
    R = rows.shape[0]
    tokens_RS = state.tokens if rows_R is None else state.tokens[rows_R]
    n_R = state.length[rows]
    live_R = live_R & (n_R >= 1)

    def at(pos_R):
        return jnp.take_along_axis(tokens_RS, jnp.clip(pos_R, 0, S - 1)[:, None], axis=1)[:, 0]

    # Re-feed t(n-2) only where its KV is missing (see `draft_block`).
    missing = (n_R >= 2) & (n_R - 2 >= state.cache.lengths[rows])
    vocab = module.config.vocab_size
    counts = cond(
        sampling.penalized(),
        lambda _: TokenCounts.of(tokens_RS, state.prompt_len[rows], n_R, vocab),
        lambda _: TokenCounts.zeros(R, vocab),
        None,
    )
    d_RG, q, cache = draft_block(
        module, params, state.cache, at(n_R - 2), at(n_R - 1), n_R, missing, live_R, sampling,
        keys_R2, spec=spec, counts=counts, slots_B=rows_R,
    )  # fmt: skip
    drafts_RG = jnp.where(live_R[:, None], d_RG, -1)

    cols = n_R[:, None] + jnp.arange(gamma, dtype=jnp.int32)[None, :]
    write = jnp.where(live_R[:, None], cols, S)
    tokens = state.tokens.at[rows[:, None], write].set(drafts_RG, mode="drop")
    length = state.length.at[rows].set(jnp.where(live_R, n_R + gamma, n_R))
    new_state = state.replace(tokens=tokens, length=length, cache=cache)
    return new_state, DraftBatch(start=n_R, tokens=drafts_RG, q=q)


@trace_cache.jit(static_argnames=("module", "spec"), donate_argnames=("state",))
def draft_rows(
    module: Llama,
    params: Any,
    state: DrafterState,
    rows_R: jax.Array,
    keep_R: jax.Array,
    next_RK: jax.Array,
    count_R: jax.Array,
    sampling: SamplingParams,
    keys_R2: jax.Array,
    live_R: jax.Array,
    *,
    spec: DraftSpec,
) -> tuple[DrafterState, DraftBatch]:
    """`draft_round` for the distinct `rows` of a pool (`edge.draft_pool`): each rolled back
    to its `keep`, its first `count` of `next` appended, then a block drafted where `live`;
    the pool's other rows are untouched and cost nothing. `state` is donated. A row that is
    not live (a filler row of the batch's bucket) must keep: `keep` >= its length, count 0."""
    state = _appended(_rolled_back(state, rows_R, keep_R), rows_R, next_RK, count_R)
    return _drafted(module, params, state, sampling, keys_R2, live_R, spec, rows_R)


class Drafter:
    """A draft model with static draft settings (`spec`); the state is a separate, immutable
    pytree.

    Every method is a jitted pure function of (weights, state, ...) -> state; weights are
    jit arguments (a W4A16 `jaxspec.quantize` model keeps its packed int4 weights resident).

        spec = DraftSpec(gamma=4, encoding="sparse")
        d = Drafter(jaxspec.quantize(draft_model, "w4a16", 128), spec)
        st = d.prefill(d.init(rows=8, max_len=1024), [prompt_ids], rows=[0])
        st, batch = d.draft(st, SamplingParams.make(8, temperature=0.8), keys)
        st = d.rollback(st, [0], [batch.start[0] + accepted])      # then append the next token
        st = d.append(st, [0], [[next_token]])
        # or all three in one call, the state donated (what an edge session does each round):
        st, batch = d.round(st, [batch.start[0] + accepted], [[next_token]], [1], sampling, keys)

    `round` donates its state (an edge session's round: no KV copy); the other methods
    leave theirs intact, so a caller may keep and reuse it.
    """

    def __init__(self, model: Model, spec: DraftSpec) -> None:
        """Raises `InvalidArgument` (a `ValueError`) if `spec` does not fit the model's
        vocabulary (sparse_k at most the vocabulary size), or drafts nothing (gamma 0: a
        session that needs no drafter)."""
        spec.check(vocab_size=model.config.vocab_size)
        if not spec.speculative:
            raise InvalidArgument("a drafter needs gamma >= 1 (gamma 0 sessions draft nothing)")
        self.model = model
        self.spec = spec

    def init(self, rows: int, max_len: int) -> DrafterState:
        return init_state(self.model, rows, max_len)

    def prefill(
        self,
        state: DrafterState,
        prompts: Sequence[Sequence[int]] | np.ndarray,
        rows: Sequence[int] | np.ndarray | None = None,
        prompt_len: Sequence[int] | None = None,
        *,
        in_place: bool = False,
    ) -> DrafterState:
        """Reset `rows` (default 0..len(prompts)-1) to `prompts` (token id lists). A context
        that holds output tokens after its prompt says where the prompt ends (`prompt_len`,
        default the whole context: the penalties count what follows as output). `in_place`
        donates `state` (a pool's rows reset without a copy of the pool; the caller must not
        use `state` again)."""
        prompts = [list(map(int, p)) for p in prompts]
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        rows = np.arange(len(prompts)) if rows is None else np.asarray(rows)
        longest = max(map(len, prompts))
        if longest > state.tokens.shape[1]:
            raise ValueError(f"a prompt of {longest} tokens exceeds max_len")
        T = bucket(longest, 8)  # few compilations
        arr = np.zeros((len(prompts), T), np.int32)
        for i, p in enumerate(prompts):
            arr[i, : len(p)] = p
        lengths = np.asarray([len(p) for p in prompts], np.int32)
        plen = lengths if prompt_len is None else np.asarray(prompt_len, np.int32)
        m = self.model
        rows = jnp.asarray(rows, jnp.int32)
        call = prefill_in_place if in_place else prefill
        return call(m.module, m.params, state, rows, arr, lengths, jnp.asarray(plen))

    def draft(
        self,
        state: DrafterState,
        sampling: SamplingParams,
        keys: jax.Array,
        live: jax.Array | None = None,
        *,
        gamma: int | None = None,
    ) -> tuple[DrafterState, DraftBatch]:
        """Draft `gamma` tokens (default `spec.gamma`) for every live row (default: rows with
        a context). A `gamma` below `spec.gamma` is one block of an adaptive session (its
        length compiles once, shared with a fixed spec of that gamma)."""
        if live is None:
            live = state.length > 0
        n = self._block_len(gamma)
        spec = self.spec.with_gamma(n)  # equal to `spec` unless adaptive or shorter
        m = self.model
        return draft(m.module, m.params, state, sampling, keys, jnp.asarray(live, bool), spec=spec)

    def round(
        self,
        state: DrafterState,
        keep: Any,
        tokens: Any,
        counts: Any,
        sampling: SamplingParams,
        keys: jax.Array,
        live: Any = None,
        *,
        gamma: int | None = None,
    ) -> tuple[DrafterState, DraftBatch]:
        """`rollback(every row, keep)`, `append(every row, tokens, counts)` and `draft(...,
        gamma=gamma)` as one jitted call (`draft_round`): an edge session's round. `state`
        is DONATED: its buffers are reused for the result, and JAX refuses it afterwards.
        `keep` `[N]` (a length at or above a row's keeps it whole), `tokens` `[N, K]` and
        `counts` `[N]` may be host arrays; `live` defaults to every row."""
        n = self._block_len(gamma)
        keep = np.asarray(keep, np.int32)
        live = np.ones(keep.shape[0], bool) if live is None else np.asarray(live, bool)
        m = self.model
        return draft_round(
            m.module, m.params, state, keep, np.asarray(tokens, np.int32),
            np.asarray(counts, np.int32), sampling, keys, live, spec=self.spec.with_gamma(n),
        )  # fmt: skip

    def _block_len(self, gamma: int | None) -> int:
        """`gamma` (default `spec.gamma`), checked to be in 1..spec.gamma."""
        n = self.spec.gamma if gamma is None else gamma
        if not 1 <= n <= self.spec.gamma:
            raise ValueError(f"a block drafts 1..{self.spec.gamma} tokens, got {n}")
        return n

    def rollback(self, state: DrafterState, rows: Any, lengths: Any) -> DrafterState:
        return rollback(state, jnp.asarray(rows, jnp.int32), jnp.asarray(lengths, jnp.int32))

    def append(
        self, state: DrafterState, rows: Any, tokens: Any, counts: Any = None
    ) -> DrafterState:
        tokens = jnp.asarray(tokens, jnp.int32)
        if counts is None:
            counts = jnp.full(tokens.shape[0], tokens.shape[1], jnp.int32)
        return append(state, jnp.asarray(rows, jnp.int32), tokens, jnp.asarray(counts, jnp.int32))


START_METHOD = "asym"  # quantizing at start-up: no calibration (seconds, not minutes)


def load_drafter(name: str, quantize: str, spec: DraftSpec) -> Drafter:
    """The edge's draft model from a checkpoint or built-in name, as a `Drafter` of `spec`.

    `quantize` is a `jaxspec.quantize` scheme ("w4a16", as a device would hold it, or
    "w8a16"), or "none" to keep the weights as stored. A float checkpoint is quantized at
    start-up by `START_METHOD` (no calibration); a checkpoint stored quantized (`smollm2-w4a16`,
    built once by the calibrated default method, or the shipped `smollm2-draft`) is used as
    stored.
    """
    model = load(name)
    if quantize != "none" and quant_spec(model) is None:
        model = quantize_model(model, quantize, method=START_METHOD)
    return Drafter(model, spec)
