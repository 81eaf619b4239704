"""The verification rule of docs/design.md §3 as one pure, jitted, batched function.

A batch row holds a block of draft tokens `d_0 .. d_{n-1}` (n = `num_draft[b]` <= K) that
sit at absolute positions `start, start+1, ...`, the target's logits for those positions
plus one (`[K+1, V]`: `logits[j]` is the target's prediction for position `start + j`), and
the distribution q_j each draft was really sampled from. Left to right:

    accept d_j   iff  u_j * q_j(d_j) < p_j(d_j)        u_j = U(ACCEPT, start + j)
    first reject at r: emit c ~ norm(max(0, p_r - q_r))  with U(RESIDUAL, start + r)
                       (p_r itself if that residual has no mass), and stop
    all accepted:      sync -> bonus b ~ p_n with U(BONUS, start + n); pipelined -> nothing

p is the target's distribution after warping (logit bias, penalties, temperature, min-p,
top-k, top-p); the penalties at position start + j read the row's `TokenCounts` (its
committed tokens) plus the block's own drafts d_0 .. d_{j-1}. q is NOT warped here: it is
whatever the edge sampled from (it warped its own logits the same way).
Output: `tokens [B, K+1]` (-1 padded), `num_accepted [B]`, per-position `accepted [B, K]`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

from jaxspec.decoding.sampling import (
    Purpose,
    SamplingParams,
    TokenCounts,
    cond,
    sample,
    uniforms,
    warp,
)
from jaxspec.protocol import MODES

# A residual with less mass than this is "p == q up to rounding": sample from p instead.
RESIDUAL_EPS = 1e-6


@flax.struct.dataclass(kw_only=True)
class DraftQ:
    """The distributions the drafts were sampled from, in one of three encodings (or `mixed`:
    the verifier's padded batch, a per-row choice of full or sparse).

    Fields (unused ones are None):
      probs: `full` -> `[B, K, V]`; `sparse`, `mixed` -> `[B, K, k]` probabilities of `ids`.
      ids: `sparse`, `mixed` -> `[B, K, k]` token ids.
      scale: `[B, K]` float32, drafts of a float16 `DraftSpec.q_dtype` only: each row of
        `probs` is exactly float16 values times its scale (what the wire sends, docs/design.md
        §4); the rule itself reads `probs` alone.
    """

    encoding: str = flax.struct.field(pytree_node=False)
    probs: jax.Array | None = None
    ids: jax.Array | None = None
    scale: jax.Array | None = None
    full_probs: jax.Array | None = None  # `mixed` only: `[B, K, V]` q of the full rows
    is_full: jax.Array | None = None  # `mixed` only: `[B]` bool

    @classmethod
    def full(cls, probs: Float[Array, "B K V"], scale: Float[Array, "B K"] | None = None) -> DraftQ:
        return cls(encoding="full", probs=jnp.asarray(probs), scale=scale)

    @classmethod
    def sparse(
        cls,
        ids: Int[Array, "B K k"],
        probs: Float[Array, "B K k"],
        scale: Float[Array, "B K"] | None = None,
    ) -> DraftQ:
        return cls(
            encoding="sparse",
            probs=jnp.asarray(probs),
            ids=jnp.asarray(ids, jnp.int32),
            scale=scale,
        )

    @classmethod
    def onehot(cls) -> DraftQ:
        return cls(encoding="onehot")

    @classmethod
    def mixed(
        cls,
        full: Float[Array, "B K V"],
        is_full: Bool[Array, " B"],
        ids: Int[Array, "B K k"],
        probs: Float[Array, "B K k"],
    ) -> DraftQ:
        """Rows of several encodings in one static layout (the verifier's padded batch): row
        b reads `full[b]` where `is_full[b]`, else its sparse `ids/probs` (a one-hot block
        is sparse with ids = drafts, probs = 1)."""
        return cls(
            encoding="mixed",
            probs=jnp.asarray(probs),
            ids=jnp.asarray(ids, jnp.int32),
            full_probs=jnp.asarray(full),
            is_full=jnp.asarray(is_full, bool),
        )

    def dense(self, draft_BK: Int[Array, "B K"], vocab: int, dtype=jnp.float32) -> jax.Array:
        """q as `[B, K, V]` probabilities."""
        if self.encoding == "mixed":
            sparse = DraftQ.sparse(self.ids, self.probs).dense(draft_BK, vocab, dtype)
            return jnp.where(self.is_full[:, None, None], self.full_probs.astype(dtype), sparse)
        if self.encoding == "full":
            return self.probs.astype(dtype)
        if self.encoding == "onehot":
            return jax.nn.one_hot(draft_BK, vocab, dtype=dtype)
        B, K, _ = self.ids.shape
        b = jnp.arange(B)[:, None, None]
        k = jnp.arange(K)[None, :, None]
        return jnp.zeros((B, K, vocab), dtype).at[b, k, self.ids].add(self.probs.astype(dtype))

    def at_drafts(self, draft_BK: Int[Array, "B K"], dtype=jnp.float32) -> Float[Array, "B K"]:
        """q_j(d_j) for every draft: `dense(...)[b, j, d_j]` without building `[B, K, V]`
        (the same sums in the same order: a sparse q adds its matching columns in turn)."""
        d = draft_BK.astype(jnp.int32)
        if self.encoding == "onehot":
            return jnp.ones(d.shape, dtype)
        if self.encoding == "full":
            return jnp.take_along_axis(self.probs.astype(dtype), d[..., None], axis=-1)[..., 0]
        acc = jnp.zeros(d.shape, dtype)
        for i in range(self.ids.shape[-1]):
            hit = self.ids[..., i] == d
            acc = acc + jnp.where(hit, self.probs[..., i].astype(dtype), 0)
        if self.encoding == "mixed":
            at = jnp.take_along_axis(self.full_probs.astype(dtype), d[..., None], axis=-1)[..., 0]
            acc = jnp.where(self.is_full[:, None], at, acc)
        return acc

    def row(
        self, j_B: Int[Array, " B"], draft_BK: Int[Array, "B K"], vocab: int, dtype=jnp.float32
    ) -> Float[Array, "B V"]:
        """q at block position `j_B[b]` of each row: `dense(...)[b, j_B[b]]`, densifying one
        position per row rather than all K."""
        rows = jnp.arange(draft_BK.shape[0])
        if self.encoding == "onehot":
            return jax.nn.one_hot(draft_BK[rows, j_B], vocab, dtype=dtype)
        if self.encoding == "full":
            return self.probs[rows, j_B].astype(dtype)
        ids, probs = self.ids[rows, j_B], self.probs[rows, j_B].astype(dtype)
        sparse = jnp.zeros((rows.shape[0], vocab), dtype).at[rows[:, None], ids].add(probs)
        if self.encoding == "mixed":
            return jnp.where(
                self.is_full[:, None], self.full_probs[rows, j_B].astype(dtype), sparse
            )
        return sparse


@flax.struct.dataclass(kw_only=True)
class Verdicts:
    """The rule's verdict on every row of a batch (the wire's per-block answer is
    `jaxspec.protocol.VerifyResult`, which the verifier builds from one row of these).

    Fields:
    tokens: `[B, K+1]` int32: accepted drafts, then the correction or bonus; -1 padded.
    num_accepted: `[B]` int32, drafts accepted (the first rejection's index).
    num_emitted: `[B]` int32, valid entries of `tokens`.
    accepted: `[B, K]` bool, draft j was accepted.
    tested: `[B, K]` bool, draft j was tested (j <= first rejection and j < num_draft).
    """

    tokens: jax.Array
    num_accepted: jax.Array
    num_emitted: jax.Array
    accepted: jax.Array
    tested: jax.Array


def _mode_array(mode: str | jax.Array, rows: int) -> jax.Array:
    if isinstance(mode, str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return jnp.full((rows,), mode == "sync")
    return jnp.asarray(mode, bool)


def verify_block(
    draft_tokens: Int[Array, "B K"],
    num_draft: Int[Array, " B"],
    target_logits: Float[Array, "B K1 V"],
    draft_q: DraftQ,
    sampling: SamplingParams,
    keys: UInt32[Array, "B 2"],
    start: Int[Array, " B"],
    mode: str | Bool[Array, " B"] = "sync",
    counts: TokenCounts | None = None,
) -> Verdicts:
    """Apply the rule of docs/design.md §3 to every row of a padded batch (see the module doc).

    The one entry point of the rule: the co-located decoder, the verifier's step and the
    tests all call it (inside their own jit or not). `mode` is "sync" (bonus after a fully
    accepted block), "pipelined" (no bonus), or a per-row bool array (True = sync). Entries
    past `num_draft[b]` are ignored. The q's are trusted here; `check_draft_q` is the
    host-side validator for untrusted input. `counts` are each row's token counts before the
    block (its prompt and committed output), needed when `sampling` sets penalties.
    """
    bonus = _mode_array(mode, draft_tokens.shape[0])
    return _verify(
        draft_tokens, num_draft, target_logits, draft_q, sampling, keys, start, bonus, counts
    )


@jax.jit
def _verify(
    draft_BK, num_draft_B, logits_BKV, draft_q, sampling, keys_B2, start_B, bonus_B, counts=None
) -> Verdicts:
    """The rule, jitted: warp the target's logits to p, then `_decide`."""
    draft_BK = draft_BK.astype(jnp.int32)
    p_BKV = _target_probs(logits_BKV, draft_BK, sampling, counts)
    return _decide(
        p_BKV, draft_BK, num_draft_B, draft_q, keys_B2, start_B, bonus_B, logits_BKV.dtype
    )


def _decide(p_BKV, draft_BK, num_draft_B, draft_q, keys_B2, start_B, bonus_B, dtype) -> Verdicts:
    """The rule on the warped target distributions p `[B, K+1, V]`: accept left to right,
    then the correction at the first rejection, or the bonus from p at position n."""
    B, K = draft_BK.shape
    V = p_BKV.shape[-1]
    in_block_BK = jnp.arange(K)[None, :] < num_draft_B[:, None]
    ok_BK = _accepted(p_BKV, draft_BK, draft_q, keys_B2, start_B, dtype) & in_block_BK
    # r = index of the first rejection (num_draft when every draft is accepted).
    r_B = jnp.sum(jnp.cumprod(ok_BK.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    all_ok_B = r_B >= num_draft_B
    p_r = p_BKV[jnp.arange(B), r_B]
    q_r = jnp.where(all_ok_B[:, None], 0, draft_q.row(jnp.minimum(r_B, K - 1), draft_BK, V, dtype))
    correction = _correction(p_r, q_r, keys_B2, start_B + r_B)
    u_bonus = uniforms(keys_B2, (start_B + num_draft_B)[:, None], Purpose.BONUS)[:, 0]
    last = jnp.where(all_ok_B, sample(p_r, u_bonus), correction)
    return _verdicts(draft_BK, r_B, last, ~all_ok_B | bonus_B, in_block_BK)


def _target_probs(logits_BKV, draft_BK, sampling, counts) -> jax.Array:
    """p `[B, K+1, V]`: each of the K+1 target distributions warped with its row's params;
    position j's penalties see the row's counts plus its drafts d_0 .. d_{j-1}."""
    B, K1, V = logits_BKV.shape
    rep = jax.tree.map(lambda a: jnp.repeat(a, K1, axis=0), sampling)
    flat = logits_BKV.reshape(B * K1, V)
    if counts is None:
        return warp(flat, rep).reshape(B, K1, V)
    # the per-position counts are built only when a row sets a penalty
    return cond(
        sampling.penalized(),
        lambda x: warp(x, rep, counts.per_position(draft_BK, K1)),
        lambda x: warp(x, rep),
        flat,
    ).reshape(B, K1, V)


def _accepted(p_BKV, draft_BK, draft_q, keys_B2, start_B, dtype) -> jax.Array:
    """`[B, K]` bool: the accept test of every draft (before the block's first rejection)."""
    K = draft_BK.shape[1]
    pos_BK = start_B[:, None] + jnp.arange(K)[None, :]
    u_acc_BK = uniforms(keys_B2, pos_BK, Purpose.ACCEPT).astype(dtype)
    p_d = jnp.take_along_axis(p_BKV[:, :K], draft_BK[..., None], axis=-1)[..., 0]
    q_d = draft_q.at_drafts(draft_BK, dtype)
    return _accepts(u_acc_BK, q_d, p_d)


def _residual(p_r: jax.Array, q_r: jax.Array) -> jax.Array:
    """`[B, V]` max(0, p - q), not normalized (`sample` scales its uniform by the mass), or p
    itself where that residual has no mass (p == q up to rounding)."""
    residual = jnp.maximum(p_r - q_r, 0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    return jnp.where(mass > RESIDUAL_EPS, residual, p_r)


def _correction(p_r, q_r, keys_B2, pos_B) -> jax.Array:
    """`[B]` the token drawn from norm(max(0, p - q)) at the first rejection (`_residual`),
    with the RESIDUAL uniform of its position."""
    u_res = uniforms(keys_B2, pos_B[:, None], Purpose.RESIDUAL)[:, 0]
    return sample(_residual(p_r, q_r), u_res)


def _verdicts(draft_BK, r_B, last_B, emit_last_B, in_block_BK) -> Verdicts:
    """The accepted drafts, then `last` (correction or bonus) where it is emitted."""
    K = draft_BK.shape[1]
    cols = jnp.arange(K + 1)[None, :]
    drafts = jnp.pad(draft_BK, ((0, 0), (0, 1)))
    tokens = jnp.where(cols < r_B[:, None], drafts, -1)
    tokens = jnp.where((cols == r_B[:, None]) & emit_last_B[:, None], last_B[:, None], tokens)
    return Verdicts(
        tokens=tokens.astype(jnp.int32),
        num_accepted=r_B,
        num_emitted=r_B + emit_last_B.astype(jnp.int32),
        accepted=jnp.arange(K)[None, :] < r_B[:, None],
        tested=(jnp.arange(K)[None, :] <= r_B[:, None]) & in_block_BK,
    )


def _accepts(u: jax.Array, q_d: jax.Array, p_d: jax.Array) -> jax.Array:
    """The accept test `u * q(d) < p(d)`: strict, so p(d) = 0 never accepts, even at u = 0."""
    return u * q_d < p_d


def check_draft_q(
    draft_tokens: np.ndarray,
    num_draft: np.ndarray,
    draft_q: DraftQ,
    vocab: int,
    atol: float = 1e-3,
) -> None:
    """Raise ValueError unless every used q is a distribution that can produce its draft:
    ids in range, probabilities finite and >= 0 summing to 1 (within `atol`), q(d) > 0."""
    d = np.asarray(draft_tokens)
    n = np.asarray(num_draft)
    B, K = d.shape
    if n.shape != (B,) or np.any(n < 0) or np.any(n > K):
        raise ValueError(f"num_draft must be {B} values in [0, {K}]")
    used = np.arange(K)[None, :] < n[:, None]
    if np.any((d < 0) | (d >= vocab)) and np.any(used & ((d < 0) | (d >= vocab))):
        raise ValueError(f"draft token ids must be in [0, {vocab})")
    if draft_q.encoding == "onehot":
        return
    probs = np.asarray(draft_q.probs, np.float64)
    if draft_q.encoding == "sparse":
        ids = np.asarray(draft_q.ids)
        if np.any(used[..., None] & ((ids < 0) | (ids >= vocab))):
            raise ValueError(f"sparse q ids must be in [0, {vocab})")
        hit = np.where(ids == d[..., None], probs, 0.0).sum(-1)
    else:
        if probs.shape[-1] != vocab:
            raise ValueError(f"full q must have {vocab} entries per position")
        hit = np.take_along_axis(probs, np.clip(d, 0, vocab - 1)[..., None], -1)[..., 0]
    p_used = probs[used]
    if not np.all(np.isfinite(p_used)) or np.any(p_used < 0):
        raise ValueError("q holds NaN, infinite or negative probabilities")
    if np.any(np.abs(p_used.sum(-1) - 1) > atol):
        raise ValueError("q is not normalized (each position must sum to 1)")
    if np.any(hit[used] <= 0):
        raise ValueError("a draft token has q(d) = 0: it cannot have been sampled from q")
