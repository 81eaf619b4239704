"""Many sessions' drafts on one device, batched: one draft call a round for every session
that has a block to draft (continuous batching, as the verifier batches its blocks).

An edge session alone drafts with a drafter state of its own (one row); a server that runs
many sessions on one device (`python -m edge serve`, `jaxspec serve`) would then run their
draft calls one after another, each paying for the draft model's weights, while one call of
several rows costs little more than one of a single row (the kernels are bound by the
weights' bytes). A `DraftPool` holds one drafter state of N rows (a KV slot pool, grown by
doubling when every row is taken, and in length when a session needs more positions): a
session takes a row (`open`), resets it to its prompt (`prefill`) and asks for each block
with `round` (the rollback, the verifier's token and the block, as `Drafter.round` does);
requests that arrive while the device drafts wait for the next call, which takes all of them
(`edge.drafter.draft_rows`: only the requesting rows, their count bucketed to a power of two
with idle rows that stay as they are). Every draw is keyed by the session's seed and the
position, and the kernels are batch-invariant, so a pooled session drafts the bits it drafts
alone: the tokens do not depend on who else was drafting.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from edge.drafter import DraftBatch, Drafter, DrafterState, draft_rows, init_state
from jaxspec.compilation.shapes import bucket
from jaxspec.decoding.sampling import SamplingParams, SamplingSettings
from jaxspec.protocol import DraftBlock

GROW_LEN = 256  # the fewest positions a row grows to (then powers of two, as `bucket`)


@jax.jit
def wire_rows(batch: DraftBatch) -> tuple:
    """Every row of a drafter's batch in the block's layout: (start, tokens, q, ids, scale,
    q16), q float32 as sampled; a float16 batch adds its float16 values, q / scale rounded to
    float16 (exactly those values: `DraftBlock` checks that q is them times the scale)."""
    q = batch.q
    q16 = None if q.scale is None else (q.probs / q.scale[..., None]).astype(jnp.float16)
    return batch.start, batch.tokens, q.probs, q.ids, q.scale, q16


def block_of(rows: tuple, i: int, session_id: str, epoch: int, n: int | None = None) -> DraftBlock:
    """Row `i` of `wire_rows`' host arrays as the protocol's one block, its first `n` drafts
    (default all)."""
    start, tokens, probs, ids, scale, q16 = (x if x is None else x[i] for x in rows)
    cut = slice(None) if n is None else slice(0, n)
    probs, ids, scale, q16 = (x if x is None else x[cut] for x in (probs, ids, scale, q16))
    return DraftBlock(
        session_id=session_id, epoch=epoch, start=int(start), tokens=tokens[cut],
        q=probs, q_ids=ids, q_scale=scale, q16=q16,
    )  # fmt: skip


@dataclasses.dataclass
class _Request:
    keep: int
    tail: tuple[int, ...]
    n: int
    settings: SamplingSettings
    key: np.ndarray  # [2] uint32, the session's key
    done: asyncio.Future


def _grown(state: DrafterState, rows: int, max_len: int) -> DrafterState:
    """`state` with room for `rows` rows of `max_len` positions (new rows empty)."""
    N, S = state.tokens.shape
    dn, ds = rows - N, max_len - S

    def pad(x: jax.Array, row_axis: int, len_axis: int | None) -> jax.Array:
        widths = [(0, 0)] * x.ndim
        widths[row_axis] = (0, dn)
        if len_axis is not None:
            widths[len_axis] = (0, ds)
        return jnp.pad(x, widths)

    c = state.cache
    cache = c.replace(k=pad(c.k, 1, 2), v=pad(c.v, 1, 2), lengths=pad(c.lengths, 0, None))
    return DrafterState(
        tokens=pad(state.tokens, 0, 1),
        length=pad(state.length, 0, None),
        cache=cache,
        prompt_len=pad(state.prompt_len, 0, None),
    )


class DraftPool:
    """One drafter state of `rows` x `max_len` shared by many sessions (module doc).

    Sessions run on one event loop (the pool is not thread-safe); each holds its row from
    `open` to `release`."""

    def __init__(self, drafter: Drafter, rows: int = 8, max_len: int = GROW_LEN) -> None:
        self.drafter = drafter
        self.rows, self.max_len = bucket(rows), bucket(max_len, 64)
        self.state: DrafterState | None = None  # allocated at the first open
        self.free = list(range(self.rows))
        self.pending: dict[int, _Request] = {}
        self.flushing: asyncio.Task | None = None
        self.calls = 0  # draft calls made (a test reads it: several sessions, one call)
        self.batched = 0  # blocks drafted

    # --- rows ---------------------------------------------------------------------------

    def open(self, max_len: int) -> int:
        """A free row with room for `max_len` positions (the pool grows to fit)."""
        rows, length = self.rows, max(self.max_len, bucket(max_len, GROW_LEN))
        if not self.free:
            rows *= 2
        if self.state is None:
            self.rows, self.max_len = rows, length
            self.state = init_state(self.drafter.model, rows, length)
        elif (rows, length) != (self.rows, self.max_len):
            self.state = _grown(self.state, rows, length)
            self.free += range(self.rows, rows)
            self.rows, self.max_len = rows, length
        return self.free.pop(0)

    def release(self, row: int) -> None:
        """Give `row` back (its request not drafted yet dropped: the row's next session must
        not get it)."""
        req = self.pending.pop(row, None)
        if req is not None and not req.done.done():
            req.done.cancel()
        self.free.append(row)

    def prefill(self, row: int, context: Sequence[int], prompt_len: int) -> None:
        """Reset `row` to `context` (its first `prompt_len` tokens the prompt), in place."""
        if not 1 <= len(context) <= self.max_len:
            raise ValueError(f"a context of {len(context)} tokens for rows of {self.max_len}")
        self.state = self.drafter.prefill(
            self.state, [context], rows=[row], prompt_len=[prompt_len], in_place=True
        )

    # --- rounds -------------------------------------------------------------------------

    async def round(
        self,
        row: int,
        keep: int,
        tail: Sequence[int],
        n: int,
        settings: SamplingSettings,
        key: np.ndarray,
        session_id: str,
        epoch: int,
    ) -> DraftBlock:
        """`Drafter.round` for `row`, batched with every other row that asks meanwhile: keep
        its first `keep` tokens, append `tail`, draft a block of `n`; the block, on the host."""
        if row in self.pending:
            raise RuntimeError(f"row {row} already has a round waiting")
        if not 1 <= n <= self.drafter.spec.gamma:
            raise ValueError(f"a block drafts 1..{self.drafter.spec.gamma} tokens, got {n}")
        done = asyncio.get_running_loop().create_future()
        self.pending[row] = _Request(keep, tuple(tail), n, settings, np.asarray(key), done)
        if self.flushing is None or self.flushing.done():
            self.flushing = asyncio.ensure_future(self._flush())
        rows, i = await done
        return block_of(rows, i, session_id, epoch, n)

    async def _flush(self) -> None:
        """Draft every waiting row, one call at a time, until none waits."""
        await asyncio.sleep(0)  # sessions answered by the same verify step ask first
        while self.pending:
            reqs, self.pending = self.pending, {}
            try:
                rows = await self._draft(reqs)
            except Exception as e:  # every waiting session hears it
                for r in reqs.values():
                    if not r.done.done():
                        r.done.set_exception(e)
                continue
            for i, r in enumerate(reqs.values()):
                if not r.done.done():
                    r.done.set_result((rows, i))

    async def _draft(self, reqs: dict[int, _Request]) -> tuple:
        """One `draft_rows` call for `reqs` (bucketed with idle rows); its blocks on the host."""
        R = len(reqs)
        B = min(bucket(R), self.rows)
        idle = [r for r in range(self.rows) if r not in reqs][: B - R]
        K = bucket(max(1, *(len(r.tail) for r in reqs.values())))
        tails = np.zeros((B, K), np.int32)
        for i, r in enumerate(reqs.values()):
            tails[i, : len(r.tail)] = r.tail
        keep = np.full(B, self.max_len, np.int32)  # idle rows: nothing cut
        keep[:R] = [r.keep for r in reqs.values()]
        count = np.zeros(B, np.int32)
        count[:R] = [len(r.tail) for r in reqs.values()]
        keys = np.zeros((B, 2), np.uint32)
        keys[:R] = [r.key for r in reqs.values()]
        sampling = SamplingParams.of([r.settings for r in reqs.values()], rows=B)
        gamma = max(r.n for r in reqs.values())  # a shorter block: its extra drafts cut
        batch = self._call([*reqs, *idle], keep, tails, count, sampling, keys, R, gamma)
        self.calls += 1
        self.batched += R
        return await asyncio.to_thread(jax.device_get, wire_rows(batch))

    def _call(
        self,
        rows: Sequence[int],
        keep: np.ndarray,
        tails: np.ndarray,
        count: np.ndarray,
        sampling: SamplingParams,
        keys: np.ndarray,
        live: int,
        gamma: int,
    ) -> DraftBatch:
        """`draft_rows` over `rows`, the first `live` of them drafting a block of `gamma`."""
        m, spec = self.drafter.model, self.drafter.spec.with_gamma(gamma)
        self.state, batch = draft_rows(
            m.module, m.params, self.state, np.asarray(rows, np.int32), keep, tails, count,
            sampling, keys, np.arange(len(rows)) < live, spec=spec,
        )  # fmt: skip
        return batch

    def warm(self, gamma: int | None = None) -> None:
        """Compile the draft call for every row bucket of the pool as it is now (idle rows
        only: nothing changes), so that no session waits on a compile of these shapes. Call
        it in a worker thread, before sessions run."""
        if self.state is None:
            self.state = init_state(self.drafter.model, self.rows, self.max_len)
        B = 1
        while B <= self.rows:
            batch = self._call(
                range(B), np.full(B, self.max_len, np.int32), np.zeros((B, 1), np.int32),
                np.zeros(B, np.int32), SamplingParams.of([], rows=B),
                np.zeros((B, 2), np.uint32), 0, gamma or self.drafter.spec.gamma,
            )  # fmt: skip
            jax.device_get(wire_rows(batch))
            B *= 2
