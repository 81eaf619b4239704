"""A block of drafts (`DraftBlock`) and the checks and float16 forms of its q (`check_q`,
`q_from_f16`, `q_to_f16`): a block is checked once, where it is made (off the wire or
in-process), and its arrays are read-only from then on."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxspec.protocol.errors import InvalidArgument

# How far from 1 a row of q may sum (the float32 rounding of a softmax over a large
# vocabulary, with room to spare): `jaxspec.decoding.verification.check_draft_q`'s tolerance.
Q_SUM_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftBlock:
    """Drafts for positions start .. start+len(tokens)-1 of a session, in one encoding.

    q: `full` -> `[n, V]` float probabilities; `sparse` -> `q_ids [n, k]` + `q [n, k]`;
    `onehot` -> neither (greedy drafts). Held as read-only float32 (what the drafter samples
    in and the verifier reads; a float64 q is rounded to float32 as it is made).
    q_scale, q16: sessions whose `q_dtype` is "float16" only: `q_scale` `[n]` float32 and
    every row of q is exactly the float16 values `q16` times its scale (`q_from_f16`); the
    wire carries `q16` and the scales, half the bytes of float32 q. Give q (then q16 is
    derived, and refused unless exact: `q_to_f16`) or q16 (then q is rebuilt from it) or both
    (then they must agree).

    Validated when made (`InvalidArgument`): every row of q is a distribution (finite, >= 0,
    summing to 1 within `Q_SUM_TOLERANCE`) that can produce its draft (q(d) > 0). This is
    THE check of q's values, made once where a block enters (the edge as it builds a block,
    `jaxspec.protocol.wire` as one comes off the wire, any in-process caller); the verifier
    adds only what needs the session (widths, vocabulary ranges, the session's encoding and q
    dtype).
    """

    session_id: str
    epoch: int
    start: int
    tokens: tuple[int, ...]
    q: np.ndarray | None = None
    q_ids: np.ndarray | None = None
    q_scale: np.ndarray | None = None
    q16: np.ndarray | None = None

    def __post_init__(self) -> None:
        tokens = _as(self.tokens, np.int64, "tokens")
        if tokens.ndim != 1:
            raise InvalidArgument(f"tokens must be a sequence of ids, got shape {tokens.shape}")
        object.__setattr__(self, "tokens", tuple(tokens.tolist()))
        n = len(tokens)
        given = (self.q, self.q_ids, self.q_scale, self.q16)
        if n == 0 and any(x is not None for x in given):
            raise InvalidArgument("a block without drafts carries no q")
        if self.q is None and self.q16 is None:
            if self.q_ids is not None or self.q_scale is not None:
                raise InvalidArgument("a block with q_ids or q_scale needs q")
            return
        q, q16, scale = _block_q(self.q, self.q16, self.q_scale, n)
        ids = None if self.q_ids is None else _frozen(_ids(self.q_ids, q.shape))
        check_q(q, ids, tokens)
        for name, value in (("q", q), ("q16", q16), ("q_scale", scale), ("q_ids", ids)):
            object.__setattr__(self, name, value)  # frozen: set once, here


def _frozen(x: np.ndarray | None) -> np.ndarray | None:
    """A read-only view of `x`: a block is checked once, so its arrays may not change after."""
    if x is None:
        return None
    x = x.view()
    x.flags.writeable = False
    return x


def _as(x: Any, dtype: Any, what: str) -> np.ndarray:
    """`x` as an array of `dtype` (None: its own); `InvalidArgument` naming `what` when it is
    not numbers (strings and objects included: nothing is parsed)."""
    try:
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise TypeError
        return a if dtype is None else a.astype(dtype, copy=False)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{what} must be an array of numbers") from None


def _rows(x: np.ndarray, n: int, what: str) -> np.ndarray:
    if x.ndim != 2 or x.shape[0] != n:
        raise InvalidArgument(f"{what} must be {n} rows (one per draft), got shape {x.shape}")
    return x


def _ids(q_ids: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A sparse block's ids, as given (the verifier checks their range), one per q entry."""
    ids = np.asarray(q_ids)
    if ids.dtype.kind not in "iu" or ids.shape != shape:
        raise InvalidArgument(f"q_ids must be integers of q's shape {shape}, got {ids.shape}")
    return ids


def _block_q(
    q: Any, q16: Any, q_scale: Any, n: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A block's (q, q16, q_scale), read-only, with q float32 `[n, m]`: q as given (float32
    blocks), or the float16 form checked for exactness (`q_to_f16` on q as given, so a float64
    q must be exactly those values) or rebuilt from q16 (`q_from_f16`)."""
    if q_scale is None:
        if q16 is not None:
            raise InvalidArgument("q16 travels with q_scale")
        return _frozen(_rows(_as(q, np.float32, "q"), n, "q")), None, None
    scale = _as(q_scale, np.float32, "q_scale")
    if q16 is None:
        q16 = q_to_f16(_rows(_as(q, None, "q"), n, "q"), scale)
    else:
        q16 = _rows(_as(q16, np.float16, "q16"), n, "q16")
        rebuilt = q_from_f16(q16, scale)
        if q is not None and not np.array_equal(rebuilt, _as(q, None, "q")):
            raise InvalidArgument("q is not float32(q16) * q_scale")
        q = rebuilt
    return _frozen(np.asarray(q, np.float32)), _frozen(q16), _frozen(scale)


def check_q(q: np.ndarray, ids: np.ndarray | None, tokens: np.ndarray) -> None:
    """Raise `InvalidArgument` unless every row of q (float32 `[n, m]`) is a distribution that
    can produce its draft `tokens[i]`: finite, >= 0, summing to 1 within `Q_SUM_TOLERANCE`
    (summed in float64), and q(d) > 0 (full: `q[i, d]`, d in [0, m); sparse: the mass of the
    columns whose `ids` are d). One pass for the minimum, one for the sums: this is the whole
    per-entry cost of checking a block."""
    if q.size and not q.min() >= 0:  # NaN fails too
        raise InvalidArgument("q holds NaN, infinite or negative probabilities")
    sums = q.sum(axis=-1, dtype=np.float64)
    if not np.all(np.isfinite(sums)):
        raise InvalidArgument("q holds NaN, infinite or negative probabilities")
    if np.any(np.abs(sums - 1) > Q_SUM_TOLERANCE):
        raise InvalidArgument("q is not normalized (each position must sum to 1)")
    if ids is None:
        if np.any((tokens < 0) | (tokens >= q.shape[1])):
            raise InvalidArgument(f"draft token ids must be in [0, {q.shape[1]})")
        hit = q[np.arange(len(tokens)), tokens]
    else:
        hit = np.where(ids == tokens[:, None], q, 0).sum(axis=-1)
    if np.any(hit <= 0):
        raise InvalidArgument("a draft token has q(d) = 0: it cannot have been sampled from q")


# float32(h) for every float16 bit pattern h (numpy's own conversion, made once): looking the
# values up is several times faster than numpy's float16 cast, and exact by construction.
_F16_TO_F32 = np.arange(1 << 16).astype(np.uint16).view(np.float16).astype(np.float32)


def q_from_f16(q16: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float32 q of a float16 block: `float32(q16[i]) * scale[i]`, row by row (`[n, m]`
    and `[n]`). One IEEE float32 multiply per entry, so it is bit for bit the q the edge
    sampled from (`jaxspec.decoding.speculative.draft_q_for`); raises `InvalidArgument` for scales
    that are not finite and > 0, or values that are NaN, infinite or negative."""
    q16 = np.asarray(q16, np.float16)
    scale = np.asarray(scale, np.float32)
    if q16.ndim != 2 or scale.shape != (q16.shape[0],):
        raise InvalidArgument(f"{q16.shape[0] if q16.ndim else 0} rows of q need as many scales")
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise InvalidArgument("q_scale must be finite and > 0")
    values = np.take(_F16_TO_F32, q16.view(np.uint16))
    if values.size and not (values.min() >= 0 and values.max() < np.inf):  # NaN fails too
        raise InvalidArgument("float16 q holds NaN, infinite or negative values")
    with np.errstate(over="ignore"):
        q = values * scale[:, None]
    if q.size and not q.max() < np.inf:  # q >= 0: the largest overflows if any does
        raise InvalidArgument("float16 q times q_scale overflows float32")
    return q


def q_to_f16(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float16 values `q16` with `q_from_f16(q16, scale) == q` exactly: what a float16 block
    sends. Raises `InvalidArgument` unless q (`[n, m]`) is such values times `scale` (`[n]`)
    bit for bit: a q that is not, the verifier could not rebuild, so it is not sent."""
    q = np.asarray(q)
    scale = np.asarray(scale, np.float32)
    if q.ndim != 2 or scale.shape != (q.shape[0],):
        raise InvalidArgument(f"{q.shape[0] if q.ndim else 0} rows of q need as many scales")
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise InvalidArgument("q_scale must be finite and > 0")
    with np.errstate(all="ignore"):  # a q that overflows float16 fails the check below
        # All in float32 (numpy's float64 -> float16 cast is ~40x slower, and float64 copies
        # of a full block doubled the check's time on the verifier's submit path). For a q
        # that is float16 values times the scale, q / scale lies within a float32 ulp or two
        # of those values, far from any float16 rounding boundary, so the rounding picks the
        # same float16; for any other q the exact check below fails either way.
        q16 = (q.astype(np.float32, copy=False) / scale[:, None]).astype(np.float16)
        ok = q.dtype.kind == "f" and np.array_equal(q_from_f16(q16, scale), q)
    if not ok:
        raise InvalidArgument("q is not float16 values times q_scale (not a float16 q)")
    return q16
