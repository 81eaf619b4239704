"""Co-located speculative decoding: draft and target in one process, one jitted loop.

Each round, for every live row with P committed tokens (prompt + new):

    draft   feed last committed token at P-1, then d_0.. : K draft steps -> d_0..d_{K-1}, q
    target  one forward over [last, d_0 .. d_{K-1}] at positions P-1 .. P+K-1 -> K+1 logits
    verify  `verification.verify_block` (docs/design.md §3) -> accepted drafts + correction / bonus
    commit  append (cut at a stop token or max_new_tokens); both caches roll back to P'-1
            (the draft's to P'-2 after a bonus: its last draft was never fed, the next
            round feeds it first)

A draft at absolute position t is sampled with U(DRAFT, t), so outputs depend only on
(seeds, prompts, models, sampling params, gamma, mode) — never on batch mates or timing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.compilation import trace_cache
from jaxspec.decoding.sampling import (
    Purpose,
    SamplingParams,
    TokenCounts,
    argmax,
    sample,
    uniforms,
    warp,
)
from jaxspec.decoding.verification import DraftQ, Verdicts, verify_block
from jaxspec.figures import AcceptanceFigures
from jaxspec.nn.model import KVCache, Llama, init_cache
from jaxspec.protocol import DraftSpec


@flax.struct.dataclass(kw_only=True)
class DecodeBatch:
    """What both decoders take (`generate._decode`, `speculative_decode`): B bucketed rows.

    Fields:
      prompt: `[B, T]` int32 prompts, right-padded.
      lengths: `[B]` int32 prompt lengths (>= 1).
      sampling: `SamplingParams` of B rows.
      keys: `[B, 2]` uint32 session keys.
      stop_ids: `[S]` int32 ids that end a row (kept in its output).
      max_new: `[]` int32, new tokens per row at most.
      num_live: `[]` int32; rows >= num_live are filler (done from the start).
    """

    prompt: jax.Array
    lengths: jax.Array
    sampling: SamplingParams
    keys: jax.Array
    stop_ids: jax.Array
    max_new: jax.Array
    num_live: jax.Array


@flax.struct.dataclass(kw_only=True)
class SpecCounters:
    """The speculative loop's counters, summed over live rows and rounds (traced).

    Fields:
      rounds: `[]` int32, verification rounds (one per live row per loop iteration).
      drafted: `[]` int32, drafts proposed.
      accepted: `[]` int32, drafts accepted.
      emitted: `[]` int32, tokens committed (accepted drafts, corrections, bonus tokens).
      per_position: `[K]` int32, rounds whose draft j was accepted.
    """

    rounds: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    emitted: jax.Array
    per_position: jax.Array

    @classmethod
    def zeros(cls, gamma: int) -> SpecCounters:
        """All counters at 0, `per_position` of length `gamma`."""
        z = jnp.int32(0)
        return cls(
            rounds=z, drafted=z, accepted=z, emitted=z, per_position=jnp.zeros(gamma, z.dtype)
        )

    def to_figures(self) -> AcceptanceFigures:
        """The host-side `AcceptanceFigures` of these (device) counters."""
        c = jax.tree.map(np.asarray, self)
        return AcceptanceFigures(
            num_drafts=int(c.rounds) if c.per_position.shape[0] else 0,
            num_draft_tokens=int(c.drafted),
            num_accepted_tokens=int(c.accepted),
            accepted_per_position=tuple(int(x) for x in c.per_position),
            rounds=int(c.rounds),
            emitted=int(c.emitted),
        )


@flax.struct.dataclass(kw_only=True)
class RoundState:
    """The co-located round loop's `lax.while_loop` carry (B rows, `buffer` new tokens).

    Fields:
      out: `[B, buffer]` int32, new tokens committed so far, -1 padded.
      num_new: `[B]` int32, new tokens committed per row (the prompt's length excluded).
      prev: `[B]` int32, the committed token before `last` (fed again when its KV is missing).
      last: `[B]` int32, the last committed token.
      done: `[B]` bool, the row hit a stop token or max_new (or is a filler row).
      target_cache, draft_cache: the two models' `KVCache`s `[L, B, S, Hkv, D]`.
      counters: `SpecCounters`.
      counts: the `TokenCounts` of each row's prompt and committed tokens (the penalties').
    """

    out: jax.Array
    num_new: jax.Array
    prev: jax.Array
    last: jax.Array
    done: jax.Array
    target_cache: KVCache
    draft_cache: KVCache
    counters: SpecCounters
    counts: TokenCounts


def draft_q_for(
    logits_BV: jax.Array,
    sampling: SamplingParams,
    u_B: jax.Array,
    encoding: str,
    sparse_k: int,
    q_dtype: str = "float32",
    counts: TokenCounts | None = None,
) -> tuple[jax.Array, Any]:
    """One draft step: the token and the q it was sampled from, in `encoding` (`counts`: the
    rows' token counts at this position, for the penalties).

    full: q = warped draft distribution; sparse: its top-`sparse_k` renormalized (ties to the
    lower id), returned as (ids, probs); onehot: greedy, d = argmax of the warped q.

    `q_dtype` "float16" (full and sparse; `DraftSpec.q_dtype`): that q is rounded to float16
    and the draft is sampled from exactly `float32(q16) * r`, r = 1 / (the float32 sum of the
    rounded values), computed once here (`_f16_q`); that float32 q is returned, with r last:
    full -> (q, r), sparse -> (ids, probs, r). The wire sends q16 and r, and the verifier's
    one multiply per entry rebuilds this q bit for bit (`jaxspec.protocol.q_from_f16`).
    """
    q = warp(logits_BV, sampling, counts)
    if encoding == "onehot":
        return argmax(q), None
    f16 = q_dtype == "float16"
    if encoding == "sparse":
        probs, ids = jax.lax.top_k(q, sparse_k)
        probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        sent, scale = _f16_q(probs) if f16 else (probs, None)
        pick = sample(sent, u_B)
        d = jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]
        out = (ids.astype(jnp.int32), sent)
        return d.astype(jnp.int32), ((*out, scale) if f16 else out)
    sent, scale = _f16_q(q) if f16 else (q, None)
    d = sample(sent, u_B)
    return d, ((sent, scale) if f16 else sent)


def _f16_q(probs_BV: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The float16 form of a q (`draft_q_for`): (float32(q16) * r, r), r = 1 / the float32 sum
    of the rounded values. A multiply, not a division: XLA may turn a division by a broadcast
    into a multiply by a reciprocal it computes itself, which the verifier could not repeat.
    The barrier keeps the q that is sampled from the very array that is returned (no fusing
    of the multiply into the sampler's cumulative sum)."""
    q16 = probs_BV.astype(jnp.float16).astype(jnp.float32)
    scale = 1.0 / jnp.sum(q16, axis=-1)
    return jax.lax.optimization_barrier(q16 * scale[:, None]), scale


def pack_q(encoding: str, qs: Any) -> DraftQ:
    """Stacked per-step q's (time-major from `lax.scan`) -> a batch-major DraftQ (with the
    float16 form's scales when `draft_q_for` returned them)."""
    if encoding == "onehot":
        return DraftQ.onehot()
    swap = functools.partial(jnp.swapaxes, axis1=0, axis2=1)
    if encoding == "sparse":
        ids, probs, *scale = qs
        return DraftQ.sparse(swap(ids), swap(probs), *map(swap, scale))
    probs, *scale = qs if isinstance(qs, tuple) else (qs,)
    return DraftQ.full(swap(probs), *map(swap, scale))


def draft_block(
    draft: Llama,
    params: Any,
    cache: Any,
    prev_B: jax.Array,
    last_B: jax.Array,
    next_pos_B: jax.Array,
    feed_prev_B: jax.Array,
    live_B: jax.Array,
    sampling: SamplingParams,
    keys_B2: jax.Array,
    *,
    spec: DraftSpec,
    counts: TokenCounts | None = None,
    slots_B: jax.Array | None = None,
) -> tuple[jax.Array, DraftQ, Any]:
    """Draft `spec.gamma` tokens per row at positions next_pos .. next_pos+gamma-1 (traced),
    each sampled as `spec.encoding` says (`spec.k` sparse columns).

    `gamma` forwards a block: the first feeds `last` (at next_pos-1) and gives draft 0, each
    further one feeds the draft before. Where a live row's KV lags its context by two
    (`feed_prev`: after a fully accepted sync block the draft never fed its own last draft,
    the bonus followed it) the first forward is two positions wide, `prev` (at next_pos-2,
    written only for those rows) and `last`: a two-row forward costs the W4A16 kernel about
    1.3 one-row forwards, a separate forward for `prev` a whole one (a fully accepted round
    cost `gamma + 1` forwards that way); a round where no row lags runs the one-wide first
    forward. The kernels are batch-invariant, so `last`'s logits have the same
    bits either way. The co-located loop and the edge drafter both draft through here, so both
    draft the same bits.
    `counts` (the rows' `TokenCounts` before the block; needed for penalties) are updated
    by the block's own drafts position by position: draft i sees d_0 .. d_{i-1}.
    `slots_B`: the cache rows the batch's rows are (None: row b is cache row b), so a pool
    of many sessions' rows drafts only those with a block to draft.
    Returns drafts `[B, gamma]`, the q's they were sampled from, and the draft cache.
    """
    G = spec.gamma

    def propose(logits_BV, pos_B, counts):
        u = uniforms(keys_B2, pos_B[:, None], Purpose.DRAFT)[:, 0]
        return draft_q_for(logits_BV, sampling, u, spec.encoding, spec.k, spec.q_dtype, counts)

    def forward(tokens, positions, valid, cache):
        """The draft over `tokens` `[B, T]` at `positions`, in cache rows `slots_B`."""
        return draft.apply({"params": params}, tokens, positions, valid, cache, slots_B)

    logits_BV, cache = _first_forward(
        draft, forward, cache, prev_B, last_B, next_pos_B, feed_prev_B, live_B
    )
    d0, q0 = propose(logits_BV, next_pos_B, counts)

    def step(c):
        j, tok_B, cache, counts, d_GB, q_G = c  # j: the draft this step proposes (>= 1)
        counts = _seen(counts, tok_B, live_B)  # d_{j-1}
        pos_B = next_pos_B - 1 + j  # where the fed token d_{j-1} sits
        logits, cache = forward(tok_B[:, None], pos_B[:, None], live_B[:, None], cache)
        d, q = propose(logits[:, 0], pos_B + 1, counts)
        d_GB = d_GB.at[j].set(d)
        q_G = jax.tree.map(lambda buf, x: buf.at[j].set(x), q_G, q)
        return j + 1, d, cache, counts, d_GB, q_G

    q_G = jax.tree.map(lambda x: jnp.zeros((G, *x.shape), x.dtype).at[0].set(x), q0)
    d_GB = jnp.zeros((G, *last_B.shape), jnp.int32).at[0].set(d0)
    init = (jnp.int32(1), d0, cache, counts, d_GB, q_G)
    _, _, cache, _, d_GB, q_G = jax.lax.while_loop(lambda c: c[0] < G, step, init)
    return d_GB.T, pack_q(spec.encoding, q_G), cache


def _first_forward(
    draft, forward, cache, prev_B, last_B, next_pos_B, feed_prev_B, live_B
) -> tuple[jax.Array, Any]:
    """A block's first forward (`draft_block`'s `forward` of the `draft` model): [prev, last]
    two wide where a live row lags, `last` alone elsewhere; returns the logits at `last`
    `[B, V]` and the cache."""

    def feed_last(cache):
        """`last` alone at next_pos-1: its logits `[B, V]` and the cache."""
        logits, cache = forward(last_B[:, None], next_pos_B[:, None] - 1, live_B[:, None], cache)
        return logits[:, 0], cache

    def feed_prev_and_last(cache):
        """[prev, last] at [next_pos-2, next_pos-1] (prev written only where `feed_prev`; its
        position clamped at 0 where it is not: a one-token prompt has no prev)."""
        fed_B2 = jnp.stack([prev_B, last_B], axis=1)
        pos_B2 = jnp.stack([jnp.maximum(next_pos_B - 2, 0), next_pos_B - 1], axis=1)
        valid_B2 = jnp.stack([live_B & feed_prev_B, live_B], axis=1)
        logits, cache = forward(fed_B2, pos_B2, valid_B2, cache)
        return logits[:, 1], cache

    # Two loops of 0 or 1 trips, not `lax.cond`: XLA:CPU copies a whole cache passed through
    # a conditional's branches (once per block, O(max_len): an edge drafter of 2048 positions
    # drafted at 2x the cost), while a loop's carry is updated in place.
    lagging = jnp.any(live_B & feed_prev_B).astype(jnp.int32)
    acc = jnp.promote_types(draft.dtype, jnp.float32)  # the model's logits (float64 models: 64)
    logits_BV = jnp.zeros((last_B.shape[0], draft.config.vocab_size), acc)

    def once(fn, trips):
        def body(c):
            k, _, cache = c
            logits, cache = fn(cache)
            return k + 1, logits.astype(acc), cache

        return lambda c: jax.lax.while_loop(lambda c: c[0] < trips, body, c)

    _, logits_BV, cache = once(feed_prev_and_last, lagging)((jnp.int32(0), logits_BV, cache))
    _, logits_BV, cache = once(feed_last, 1 - lagging)((jnp.int32(0), logits_BV, cache))
    return logits_BV, cache


@trace_cache.jit(static_argnames=("target", "draft", "spec", "buffer"))
def speculative_decode(
    target: Llama,
    draft: Llama,
    target_params: Any,
    draft_params: Any,
    batch: DecodeBatch,
    sync_B: jax.Array,
    *,
    spec: DraftSpec,
    buffer: int,
) -> tuple[jax.Array, SpecCounters]:
    """The jitted round loop (`spec.gamma` drafts per round, q sent as `spec.encoding`);
    returns new tokens `[B, buffer]` (-1 padded) and the counters."""
    B, T = batch.prompt.shape
    K = spec.gamma
    S = T + buffer + K + 1
    tcache = init_cache(target.config, B, S, target.dtype)
    dcache = init_cache(draft.config, B, S, draft.dtype)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    pre_valid = positions < (batch.lengths - 1)[:, None]
    with jax.named_scope("prefill_target"):
        _, tcache = target.apply(
            {"params": target_params}, batch.prompt, positions, pre_valid, tcache
        )
    with jax.named_scope("prefill_draft"):
        _, dcache = draft.apply(
            {"params": draft_params}, batch.prompt, positions, pre_valid, dcache
        )
    at = functools.partial(jnp.take_along_axis, batch.prompt, axis=1)
    state = RoundState(
        out=jnp.full((B, buffer), -1, jnp.int32),
        num_new=jnp.zeros(B, jnp.int32),
        prev=at(jnp.maximum(batch.lengths - 2, 0)[:, None])[:, 0],
        last=at((batch.lengths - 1)[:, None])[:, 0],
        done=jnp.arange(B) >= batch.num_live,
        target_cache=tcache,
        draft_cache=dcache,
        counters=SpecCounters.zeros(K),
        counts=TokenCounts.of(batch.prompt, batch.lengths, batch.lengths, target.config.vocab_size),
    )
    loop = _Round(target, draft, target_params, draft_params, batch, sync_B, spec, buffer)
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done), loop, state)
    return final.out, final.counters


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (arrays inside)
class _Round:
    """One round of `speculative_decode`'s loop (its body: draft, target, rule, commit), with
    what stays fixed across rounds."""

    target: Llama
    draft: Llama
    target_params: Any
    draft_params: Any
    batch: DecodeBatch
    sync_B: jax.Array
    spec: DraftSpec
    buffer: int

    def __call__(self, s: RoundState) -> RoundState:
        b, K = self.batch, self.spec.gamma
        B = b.prompt.shape[0]
        live_B = ~s.done
        P_B = b.lengths + s.num_new  # committed length; the next token sits at P
        missing_B = (P_B >= 2) & (s.draft_cache.lengths < P_B - 1)  # prev's KV not written
        # The scopes name the round's parts in compiled programs and profiles (the bench's
        # device account, jaxspec_apps/bench/device_account.py).
        with jax.named_scope("round_draft"):
            d_BK, draft_q, dcache = draft_block(
                self.draft, self.draft_params, s.draft_cache, s.prev, s.last, P_B, missing_B,
                live_B, b.sampling, b.keys, spec=self.spec, counts=s.counts,
            )  # fmt: skip
        block = jnp.concatenate([s.last[:, None], d_BK], axis=1)
        pos = P_B[:, None] - 1 + jnp.arange(K + 1)[None, :]
        valid = jnp.broadcast_to(live_B[:, None], (B, K + 1))
        params = {"params": self.target_params}
        with jax.named_scope("round_target"):
            logits, tcache = self.target.apply(params, block, pos, valid, s.target_cache)
        num_draft = jnp.where(live_B, K, 0)
        with jax.named_scope("round_rule"):
            vr = verify_block(
                d_BK, num_draft, logits, draft_q, b.sampling, b.keys, P_B, self.sync_B, s.counts
            )  # fmt: skip
            return self._commit(s, vr, num_draft, tcache, dcache)

    def _commit(self, s, vr: Verdicts, num_draft, tcache, dcache) -> RoundState:
        """Append the verdict's tokens (cut at the first stop token and at max_new), roll
        both caches back to the committed length (the draft's to what it wrote, when that is
        less: a bonus after a fully accepted block follows a draft it never fed), count."""
        b, K, B = self.batch, self.spec.gamma, self.batch.prompt.shape[0]
        live_B, n_B = ~s.done, s.num_new
        cols = jnp.arange(K + 1)[None, :]
        emitted = cols < vr.num_emitted[:, None]
        is_stop = emitted & jnp.isin(vr.tokens, b.stop_ids)
        first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, K + 2)
        cnt = jnp.minimum(jnp.minimum(vr.num_emitted, first_stop), b.max_new - n_B)
        cnt = jnp.where(live_B, cnt, 0).astype(jnp.int32)
        idx = jnp.where(cols < cnt[:, None], n_B[:, None] + cols, self.buffer)
        out = s.out.at[jnp.arange(B)[:, None], idx].set(vr.tokens, mode="drop")
        at = functools.partial(jnp.take_along_axis, vr.tokens, axis=1)
        new_last = at(jnp.maximum(cnt - 1, 0)[:, None])[:, 0]
        new_prev = at(jnp.maximum(cnt - 2, 0)[:, None])[:, 0]
        prev_B = jnp.where(cnt >= 2, new_prev, jnp.where(cnt == 1, s.last, s.prev))
        n_B = n_B + cnt
        rollback = (b.lengths + n_B - 1).astype(jnp.int32)
        return RoundState(
            out=out, num_new=n_B, prev=prev_B, last=jnp.where(cnt > 0, new_last, s.last),
            done=s.done | (first_stop <= cnt) | (n_B >= b.max_new),
            target_cache=tcache.replace(lengths=rollback),
            draft_cache=dcache.replace(lengths=jnp.minimum(dcache.lengths, rollback)),
            counters=_counted(s.counters, vr, num_draft, cnt, live_B),
            counts=_committed(s.counts, vr, cnt),
        )  # fmt: skip


def _seen(counts: TokenCounts | None, d_B: jax.Array, live_B: jax.Array) -> TokenCounts | None:
    """The counts a block's next draft reads: `counts` plus the draft before it, `d`, on live
    rows (`draft_block`: draft i sees d_0 .. d_{i-1})."""
    if counts is None:
        return None
    return counts.add(jnp.where(live_B, d_B, -1)[:, None])


def _committed(counts: TokenCounts, vr: Verdicts, cnt_B: jax.Array) -> TokenCounts:
    """The penalties' counts after a round: the first `cnt` tokens of each verdict added, the
    committed ones only (rejected drafts never counted: rolled back with the caches)."""
    return counts.add(vr.tokens, cnt_B)


def _counted(c: SpecCounters, vr: Verdicts, num_draft, cnt, live_B) -> SpecCounters:
    """The counters after one round (live rows only)."""
    live_i = live_B.astype(jnp.int32)
    return SpecCounters(
        rounds=c.rounds + jnp.sum(live_i, dtype=jnp.int32),
        drafted=c.drafted + jnp.sum(num_draft, dtype=jnp.int32),
        accepted=c.accepted + jnp.sum(vr.num_accepted * live_i, dtype=jnp.int32),
        emitted=c.emitted + jnp.sum(cnt, dtype=jnp.int32),
        per_position=c.per_position
        + jnp.sum(vr.accepted & live_B[:, None], axis=0).astype(jnp.int32),
    )
