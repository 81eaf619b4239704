"""Shape buckets: sizes rounded up so that nearby sizes share one jit compilation.

`bucket` rounds a size up to a power of two; a verifier's batched step instead has a few
fixed buckets (rows, block width, KV positions attended), chosen once from its sizes
(`row_buckets_for`, `kv_buckets_for`) and looked up with `bucket_in`; `warmup_shapes` and
`warmup_order` list every shape it compiles, which `shape_name` names in logs.
"""

from __future__ import annotations

from typing import Protocol


class StepBuckets(Protocol):
    """What the shape lists read of a verifier's settings (`verify.SchedulerConfig`): its
    row, width and KV buckets, the prompt positions prefilled per row and step, the slot's
    length."""

    row_buckets: tuple[int, ...]
    width_buckets: tuple[int, ...]
    kv_buckets: tuple[int, ...]
    prefill_chunk: int
    max_len: int


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= `n`, and at least `minimum` (itself a power of two).

    Every padded dimension that varies from call to call (batch rows, prompt length, new
    tokens, a session's KV length) goes through here, so a jitted function compiles once per
    bucket instead of once per size: bucket(5) == 8, bucket(5, 64) == 64, bucket(65, 64) == 128.
    """
    if n < 0:
        raise ValueError(f"a size is >= 0, got {n}")
    return max(minimum, 1 << max(0, n - 1).bit_length())


def bucket_in(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest of `buckets` (ascending) that holds `n`; `ValueError` past the largest."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def row_buckets_for(max_sessions: int, data: int = 1) -> tuple[int, ...]:
    """Row buckets data, 2 data, 4 data, ... below `max_sessions`, then `max_sessions`: few
    compiled step shapes, each a multiple of the mesh's `data` shards (when max_sessions is)."""
    rows, b = [], data
    while b < max_sessions:
        rows.append(b)
        b *= 2
    return (*rows, max_sessions)


def kv_buckets_for(max_len: int) -> tuple[int, ...]:
    """Half the slot (rounded up to 64 positions) and the whole slot: two attention widths,
    so a batch of short sessions reads half the KV a full-slot step would. Slots under 256
    positions keep one (their KV is small next to the weights; a bucket costs compilations)."""
    half = -(-max_len // 2 // 64) * 64
    return (half, max_len) if 128 <= half < max_len else (max_len,)


def shape_name(shape: tuple[str, int, int, int]) -> str:
    """How logs name a `warmup_shapes` shape: "step RxWxA" (rows, width, KV bucket), "prefill
    RxC" (rows, chunk)."""
    kind, R, W, A = shape
    return f"{kind} {R}x{W}" + (f"x{A}" if kind == "step" else "")


def warmup_order(config: StepBuckets) -> list[tuple[str, int, int, int]]:
    """`warmup_shapes` in the order the first requests need them: row bucket by row bucket,
    smallest first, each bucket's prefill (a session's prompt comes first) and then its step
    widths, the full block (max_gamma + 1, what a fixed-gamma client sends) first, at the
    shortest KV bucket first. The first `1 + len(config.width_buckets)` shapes serve a lone
    session completely while it fits the shortest KV bucket."""
    out = []
    for R in config.row_buckets:
        out.append(("prefill", R, config.prefill_chunk, config.max_len))
        out += [
            ("step", R, W, A) for A in config.kv_buckets for W in reversed(config.width_buckets)
        ]
    return out


def warmup_shapes(config: StepBuckets) -> list[tuple[str, int, int, int]]:
    """What `Scheduler.warmup` compiles, in order: ("step", rows, width, attended) for every
    row, width and KV bucket (the shortest KV first: new sessions need it), then ("prefill",
    rows, prefill_chunk, max_len) for every row bucket (its progress names them "step
    RxWxA", "prefill RxC")."""
    step = [
        ("step", R, W, A)
        for A in config.kv_buckets
        for R in config.row_buckets
        for W in config.width_buckets
    ]
    return step + [("prefill", R, config.prefill_chunk, config.max_len) for R in config.row_buckets]
