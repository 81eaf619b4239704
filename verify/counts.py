"""The penalties' token counts of every slot, kept on device beside the KV pool.

Slot s holds `TokenCounts` row s: which tokens its session's prompt holds and how often
each token occurs among its committed output tokens. The verify step reads the rows of its
batch (`gather`), adds each block's drafts position by position itself
(`jaxspec.decoding.verification`), and the scheduler then adds only what it committed
(`commit`): the rejected drafts of a block are never counted, which is the rollback that goes
with lowering the slot's KV length. A session (re)opened — a resume included — sets its row from its
prompt and committed tokens (`reset`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.decoding.sampling import TokenCounts


def init(slots: int, vocab: int) -> TokenCounts:
    """Empty counts for `slots` slots."""
    return TokenCounts.zeros(slots, vocab)


@jax.jit
def gather(pool: TokenCounts, slots_R: jax.Array) -> TokenCounts:
    """The rows of `slots` (a batch's counts before its blocks)."""
    return jax.tree.map(lambda a: a[slots_R], pool)


@jax.jit
def reset(pool: TokenCounts, slot: jax.Array, prompt: jax.Array, output: jax.Array) -> TokenCounts:
    """Slot `slot` set to the counts of `prompt` and `output` (token ids, -1 padded)."""
    V = pool.output.shape[-1]
    p = jnp.zeros(V, bool).at[jnp.where(prompt >= 0, prompt, V)].set(True, mode="drop")
    o = jnp.zeros(V, jnp.int32).at[jnp.where(output >= 0, output, V)].add(1, mode="drop")
    return TokenCounts(prompt=pool.prompt.at[slot].set(p), output=pool.output.at[slot].set(o))


@jax.jit
def commit(pool: TokenCounts, slots_R: jax.Array, tokens_RW: jax.Array) -> TokenCounts:
    """Add each row's committed tokens (-1 padded) to its slot's output counts."""
    V = pool.output.shape[-1]
    ids = jnp.where(tokens_RW >= 0, tokens_RW, V)  # V: out of range, dropped
    rows = jnp.broadcast_to(slots_R[:, None], ids.shape)
    return pool.replace(output=pool.output.at[rows, ids].add(1, mode="drop"))


def padded(tokens: list[int] | tuple[int, ...], width: int | None = None) -> np.ndarray:
    """Token ids as an int32 array padded with -1 to a power of two (few compilations)."""
    n = len(tokens)
    w = width or max(8, 1 << max(n - 1, 0).bit_length())
    out = np.full(w, -1, np.int32)
    out[:n] = tokens
    return out
