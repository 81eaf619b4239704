"""What a forward costs inside a jitted loop: the figures `gamma="auto"` prices a round with.

A co-located round runs gamma draft forwards (the first two positions wide after a fully
accepted block, `speculative.draft_block`) and one target forward of gamma + 1 positions. On a
CPU a forward of a few positions costs more than one of a single position (the matmul kernels'
many-row paths, attention per query, the head per row): SmolLM2-135M's target forward of 9
positions costs about 1.9 of one position's, so the verify step's growth with gamma decides
where a longer block stops paying. `forward_seconds` measures it where it is spent: n forwards
in one jitted `lax.fori_loop` against n0, so dispatch and the result's transfer cancel out
(a forward timed through its own jitted call pays ~2.5 ms of dispatch for SmolLM2's ~270
weight arrays, more than a third of a W4A16 forward).

Measurements are kept per process for each (weights, module, width, cache length) in a
`PerWeights` store: the weights and the machine do not change between calls.
"""

from __future__ import annotations

import functools
import itertools
import time
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxspec.decoding.sampling import argmax
from jaxspec.nn.model import Llama, init_cache


class PerWeights:
    """Figures kept per process for given weights (and more key parts): keyed by the weights'
    id, but an id is reused once the weights are freed, so each entry holds a weak reference
    to the weights' first array and is taken only while it is still that very array (figures
    of freed weights are never read for new ones, and holding them keeps no weights alive)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    @staticmethod
    def _first(params: Any) -> Any:
        return jax.tree.leaves(params)[0]

    def get(self, params: tuple[Any, ...], rest: tuple[Any, ...]) -> Any:
        """The value kept for `params` (a tuple of param trees) and `rest`, or None."""
        entry = self._entries.get((*map(id, params), *rest))
        if entry is None:
            return None
        refs, value = entry
        alive = all(r() is self._first(p) for r, p in zip(refs, params, strict=True))
        return value if alive else None

    def put(self, params: tuple[Any, ...], rest: tuple[Any, ...], value: Any) -> None:
        refs = tuple(weakref.ref(self._first(p)) for p in params)
        self._entries[(*map(id, params), *rest)] = (refs, value)


_SEEN = PerWeights()  # forward seconds per (weights, module, width, cache length)
LOOPS = (2, 6)  # forwards per timed call: the difference is four forwards
TURNS = 3  # timed calls of each length, in turns; the least counts


@functools.partial(jax.jit, static_argnames=("module", "width", "cache_len"))
def _forwards(module: Llama, params: Any, steps: jax.Array, width: int, cache_len: int) -> Any:
    """`steps` forwards of one row of `width` positions, each at the positions after the last
    (a decode loop's access pattern); returns a scalar of the last logits (to wait for)."""
    cache = init_cache(module.config, 1, cache_len, module.dtype)
    pos = jnp.arange(width, dtype=jnp.int32)[None, :]
    ones = jnp.ones((1, width), bool)

    def body(i, carry):
        tok, cache = carry
        logits, cache = module.apply({"params": params}, tok, pos + i * width, ones, cache)
        return argmax(logits), cache

    tok, _ = jax.lax.fori_loop(0, steps, body, (jnp.zeros((1, width), jnp.int32), cache))
    return tok[0, 0]


def forward_seconds(model: Any, widths: Sequence[int], cache_len: int = 256) -> dict[int, float]:
    """Seconds of one forward of `model` (a `jaxspec.Model`) over one row of each width, inside
    a jitted loop over a cache of `cache_len` positions (module doc). Compiles one loop per
    width the first time; later calls of the same weights read what was measured."""
    out = {}
    for w in widths:
        rest = (model.module, w, cache_len)
        out[w] = _SEEN.get((model.params,), rest)
        if out[w] is None:
            out[w] = _measure(model, w, max(cache_len, (LOOPS[1] + 1) * w))
            _SEEN.put((model.params,), rest, out[w])
    return out


def _measure(model: Any, width: int, cache_len: int) -> float:
    """The least time of `LOOPS[1]` forwards minus that of `LOOPS[0]`, per forward."""
    best = {}
    for n in LOOPS:  # compile and warm each
        _forwards(model.module, model.params, jnp.int32(n), width, cache_len).block_until_ready()
    for _ in range(TURNS):
        for n in LOOPS:
            t0 = time.perf_counter()
            _forwards(
                model.module, model.params, jnp.int32(n), width, cache_len
            ).block_until_ready()
            best[n] = min(best.get(n, float("inf")), time.perf_counter() - t0)
    return max(best[LOOPS[1]] - best[LOOPS[0]], 1e-9) / (LOOPS[1] - LOOPS[0])


def interpolated(seconds: dict[int, float], width: int) -> float:
    """The cost at `width` read off measured widths, linear between the two around it (the
    nearest measured one's outside them)."""
    ws = sorted(seconds)
    if width <= ws[0]:
        return seconds[ws[0]]
    for lo, hi in itertools.pairwise(ws):
        if width <= hi:
            f = (width - lo) / (hi - lo)
            return seconds[lo] + f * (seconds[hi] - seconds[lo])
    return seconds[ws[-1]]
