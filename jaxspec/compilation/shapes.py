"""Shape buckets: sizes rounded up so that nearby sizes share one jit compilation."""

from __future__ import annotations


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= `n`, and at least `minimum` (itself a power of two).

    Every padded dimension that varies from call to call (batch rows, prompt length, new
    tokens, a session's KV length) goes through here, so a jitted function compiles once per
    bucket instead of once per size: bucket(5) == 8, bucket(5, 64) == 64, bucket(65, 64) == 128.
    """
    if n < 0:
        raise ValueError(f"a size is >= 0, got {n}")
    return max(minimum, 1 << max(0, n - 1).bit_length())
