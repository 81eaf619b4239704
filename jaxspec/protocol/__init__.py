"""The edge <-> verifier session protocol as Python types (docs/design.md §4).

`verify` implements `VerifierEndpoint` in-process (`LocalVerifier`) and behind gRPC; `edge`
consumes any endpoint. Neither imports the other: both meet here. Errors carry the gRPC
status they map to, so every transport reports the same precise status.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from jaxspec.figures import AcceptanceFigures


class VerifierError(Exception):
    """Base of protocol errors; `code` names the gRPC status it maps to."""

    code = "INTERNAL"


class InvalidArgument(VerifierError, ValueError):
    code = "INVALID_ARGUMENT"


class NotFound(VerifierError, KeyError):
    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class FailedPrecondition(VerifierError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(VerifierError):
    """Out of slots or queue space; `retry_after_s` hints when to try again."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float = 0.05):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(VerifierError):
    code = "UNAUTHENTICATED"


class PermissionDenied(VerifierError):
    code = "PERMISSION_DENIED"


class Unavailable(VerifierError):
    """The verifier went away or is draining: reopen (resume) the session, maybe elsewhere."""

    code = "UNAVAILABLE"


class DeadlineExceeded(VerifierError):
    code = "DEADLINE_EXCEEDED"


ERRORS: dict[str, type[VerifierError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
    )
}


ENCODINGS: tuple[str, ...] = ("full", "sparse", "onehot")
# How q travels: float32 values, or float16 values with one float32 scale per draft (the
# edge then samples from exactly float32(q16) * scale, docs/design.md §3).
Q_DTYPES: tuple[str, ...] = ("float32", "float16")
MODES: tuple[str, ...] = ("sync", "pipelined")
GAMMA_CEILING = 64  # the most drafts any block may carry; a verifier's max_gamma is at most this


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftSpec:
    """How the edge drafts: `gamma` drafts per block, sent in one `encoding` (docs/design.md
    §3: `full` q over the vocabulary, `sparse` top-`sparse_k` q, `onehot` token ids only).

    `q_dtype` is how q travels: "float32", or "float16" (half the bytes): the edge rounds its
    q (full, or the renormalized top-k) to float16, takes the float32 sum s of the rounded
    values and the scale r = 1/s, and samples the draft from exactly `float32(q16) * r`; the
    block carries q16 and r, from which the verifier rebuilds that q bit for bit (one IEEE
    multiply per entry). Meaningless for `onehot` (no q): accepted, changes nothing.

    `gamma=0` turns speculation off for the request: its blocks carry no drafts and the
    verifier samples each token itself, one per block, with the draw plain decoding uses
    (U(TARGET, position)), so the tokens are `jaxspec.generate`'s without a draft. No drafter
    runs; in either mode each block waits for the one before (nothing to draft ahead).

    `adaptive` (`gamma="auto"` on the command line): `gamma` is the LONGEST block the edge may
    send, and the edge picks each block's length in [1, gamma] as it goes (`edge.run_session`'s
    `block_len`). The verifier takes any block of 1..gamma drafts either way; the flag tells
    it (and its metrics) that the lengths are chosen, not fixed.

    Validated when made (an `InvalidArgument`, which is a `ValueError`), so a spec that exists
    is well formed; `check` adds the limits of one model or verifier.
    """

    gamma: int = 4
    encoding: str = "full"
    sparse_k: int = 8  # used by `sparse` only
    adaptive: bool = False
    q_dtype: str = "float32"  # "float16": q travels as float16 values + a scale per draft

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise InvalidArgument(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.q_dtype not in Q_DTYPES:
            raise InvalidArgument(f"q_dtype must be one of {Q_DTYPES}, got {self.q_dtype!r}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int | np.integer):
            raise InvalidArgument(
                f"gamma must be an integer (the longest block, with adaptive=True for "
                f"'auto'), got {self.gamma!r}"
            )
        if not 0 <= self.gamma <= GAMMA_CEILING:
            raise InvalidArgument(f"gamma must be in [0, {GAMMA_CEILING}], got {self.gamma}")
        if not isinstance(self.adaptive, bool):
            raise InvalidArgument(f"adaptive must be a bool, got {self.adaptive!r}")
        if self.adaptive and self.gamma < 1:
            raise InvalidArgument("an adaptive spec needs gamma >= 1 (its longest block)")
        if self.encoding == "sparse" and self.sparse_k < 1:
            raise InvalidArgument(f"sparse_k must be >= 1, got {self.sparse_k}")

    @property
    def speculative(self) -> bool:
        """Whether blocks carry drafts (gamma >= 1); gamma 0 is speculation off."""
        return self.gamma > 0

    @property
    def k(self) -> int:
        """Columns of sparse q per draft (0 unless `sparse`)."""
        return self.sparse_k if self.encoding == "sparse" else 0

    @property
    def f16(self) -> bool:
        """Whether q is drafted and sent in the float16 form (`q_dtype`; never for onehot)."""
        return self.q_dtype == "float16" and self.encoding != "onehot"

    def with_gamma(self, gamma: int) -> DraftSpec:
        """This spec drafting blocks of exactly `gamma` (not adaptive): what one block of an
        adaptive session is drafted with."""
        return dataclasses.replace(self, gamma=gamma, adaptive=False)

    def check(
        self, *, vocab_size: int, max_gamma: int = GAMMA_CEILING, max_sparse_k: int | None = None
    ) -> None:
        """Raise `InvalidArgument` unless this spec fits a vocabulary and a verifier's limits."""
        if self.gamma > max_gamma:
            raise InvalidArgument(f"gamma must be in [0, {max_gamma}], got {self.gamma}")
        limit = vocab_size if max_sparse_k is None else min(vocab_size, max_sparse_k)
        if self.k > limit:
            raise InvalidArgument(f"sparse_k must be in [1, {limit}], got {self.sparse_k}")


# Most logit-bias entries a session may carry (a bound on every list a request carries), and
# the range of a bias (OpenAI's: -100 bans a token, +100 all but forces it). Presence and
# frequency penalties are bounded as OpenAI and vLLM bound them.
MAX_LOGIT_BIAS = 32
LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0
_INT32_LIMIT = 1 << 31  # top_k and the bias token ids become int32 arrays


def _number(value: Any, name: str) -> float:
    """`value` as a Python float (exactly: float32 and float64 values convert without
    rounding); `InvalidArgument` naming `name` when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{name} must be a number, got {value!r}") from None


def _float32(x: float) -> float:
    """`x` rounded to float32, as the sampling arrays hold it (the ranges are checked there:
    a value that is in range only in float64, e.g. a top_p of 1e-50, is 0 in the rule)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """A `{token id: bias}` map, or `(id, bias)` pairs (a later pair of the same id wins, as
    `dict` reads them), as sorted `(int, float)` pairs; `InvalidArgument` naming the bad entry
    (too many, an id that is not an int >= 0, a bias not finite or outside
    +-LOGIT_BIAS_LIMIT). The vocabulary is `SamplingSettings.check_vocab`'s to check."""
    if not value:
        return ()
    try:
        pairs = dict(value)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"logit_bias must map token ids to biases, got {type(value).__name__}"
        ) from None
    if len(pairs) > MAX_LOGIT_BIAS:
        raise InvalidArgument(f"logit_bias has {len(pairs)} entries; at most {MAX_LOGIT_BIAS}")
    out = []
    for tok, bias in pairs.items():
        if isinstance(tok, bool) or not isinstance(tok, int | np.integer) or tok < 0:
            raise InvalidArgument(f"logit_bias token ids must be ints >= 0, got {tok!r}")
        if tok >= _INT32_LIMIT:
            raise InvalidArgument(f"logit_bias token id {tok} is outside [0, 2**31)")
        b = _number(bias, f"logit_bias[{tok}]")
        if not math.isfinite(b) or abs(b) > LOGIT_BIAS_LIMIT:
            raise InvalidArgument(
                f"logit_bias[{tok}] must be finite and within +-{LOGIT_BIAS_LIMIT:g}, got {bias}"
            )
        out.append((int(tok), b))
    return tuple(sorted(out))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """How one session (or one row of `jaxspec.generate`) samples: the same settings warp
    the target's p and the draft's q (`jaxspec.decoding.sampling`'s order: logit bias, penalties,
    temperature, min-p, top-k, top-p).

    temperature >= 0 (0 greedy); top_k >= 0 (0 off); top_p in (0, 1] (1 off); min_p in [0, 1]
    (0 off); logit_bias: `(token id, bias)` pairs added to the logits first (a `{id: bias}`
    map is taken too), at most MAX_LOGIT_BIAS, each within +-LOGIT_BIAS_LIMIT; penalties
    (vLLM's semantics): repetition_penalty finite and > 0 (1 off) over prompt and output
    tokens, presence and frequency finite within +-PENALTY_LIMIT (0 off) over output tokens.

    Validated when made (`InvalidArgument`, a `ValueError`, naming the field), so settings
    that exist are well formed: this is THE check of the values, made where they enter (the
    flags, the API's keywords, a request off the wire or over HTTP); `check_vocab` adds the
    one rule that needs the model. The values are kept as Python numbers (the bias as sorted
    pairs); the rule reads them as float32 / int32 arrays (`SamplingParams.of`), and the
    ranges are checked on those float32 values.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        t = _number(self.temperature, "temperature")
        if not math.isfinite(_float32(t)) or t < 0:
            raise InvalidArgument(f"temperature must be finite and >= 0, got {self.temperature}")
        k = self._top_k()
        p = _number(self.top_p, "top_p")
        if not math.isfinite(_float32(p)) or not 0 < _float32(p) <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        m = _number(self.min_p, "min_p")
        if not math.isfinite(m) or not 0 <= _float32(m) <= 1:
            raise InvalidArgument(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        r = _number(self.repetition_penalty, "repetition_penalty")
        if not math.isfinite(r) or r <= 0 or _float32(r) <= 0:
            raise InvalidArgument(f"repetition_penalty must be finite and > 0 (1 = off), got {r}")
        e = _number(self.presence_penalty, "presence_penalty")
        f = _number(self.frequency_penalty, "frequency_penalty")
        for v, name in ((e, "presence_penalty"), (f, "frequency_penalty")):
            if not math.isfinite(v) or abs(v) > PENALTY_LIMIT:
                raise InvalidArgument(
                    f"{name} must be finite and within +-{PENALTY_LIMIT:g} (0 = off), got {v}"
                )
        checked = dict(temperature=t, top_k=k, top_p=p, min_p=m, repetition_penalty=r,
                       presence_penalty=e, frequency_penalty=f,
                       logit_bias=_logit_bias(self.logit_bias))  # fmt: skip
        for name, value in checked.items():  # as plain Python numbers (frozen: set once here)
            object.__setattr__(self, name, value)

    def _top_k(self) -> int:
        """top_k as an int, checked: an integer in [0, 2**31)."""
        try:
            k = operator.index(self.top_k)
        except TypeError:
            raise InvalidArgument(f"top_k must be an integer, got {self.top_k!r}") from None
        if k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 = off), got {k}")
        if k >= _INT32_LIMIT:
            raise InvalidArgument(f"top_k is out of range, got {k}")
        return int(k)

    @property
    def penalized(self) -> bool:
        """Whether a penalty is set (the verifier then keeps the session's token counts)."""
        return (
            self.repetition_penalty != 1
            or self.presence_penalty != 0
            or self.frequency_penalty != 0
        )

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `InvalidArgument` unless every biased token id is in the vocabulary (the one
        rule a model's size decides; the verifier checks it when a session opens)."""
        for tok, _ in self.logit_bias:
            if tok >= vocab_size:
                raise InvalidArgument(f"logit_bias token id {tok} is outside [0, {vocab_size})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """What `OpenSession` carries. `sampling` applies to the target and the draft alike."""

    prompt: tuple[int, ...]
    max_new_tokens: int = 64
    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    seed: int = 0
    mode: str = "sync"  # "sync" | "pipelined"
    draft: DraftSpec = DraftSpec()
    stop_tokens: tuple[int, ...] | None = None  # None: the target's EOS ids
    # Resume: new tokens already committed by a verifier that went away. Draws are keyed
    # by position, so the reopened session continues exactly where the old one stopped.
    committed: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """The verifier's answer to OpenSession: the session's id and what it took: `gamma` (the
    drafts its blocks carry at most), the sparse-q and vocabulary limits, max_new_tokens."""

    session_id: str
    gamma: int
    max_sparse_k: int
    vocab_size: int
    max_new_tokens: int


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """The verifier's answer to one block.

    accepted: drafts accepted; tokens: the committed tokens this block added (accepted
    drafts, then the correction or bonus, cut at a stop token / max_new_tokens);
    next_token: the correction or bonus (None when none was emitted); new_epoch: the
    session's epoch after this block (epoch + 1 after a rejection); stale: the block was
    dropped (old epoch or start != committed length) and changed nothing; figures: the
    session's acceptance totals after this block (`AcceptanceFigures`, every result alike).
    """

    epoch: int
    start: int
    accepted: int = 0
    tokens: tuple[int, ...] = ()
    next_token: int | None = None
    new_epoch: int = 0
    stale: bool = False
    finished: bool = False
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)
    # The verify step that answered this block (0: stale): a measurement, not part of what
    # the result says, so it takes no part in equality.
    step_s: float = dataclasses.field(default=0.0, compare=False)


@runtime_checkable
class VerifierEndpoint(Protocol):
    """Open a session, verify blocks (several may be in flight), close it."""

    async def open_session(self, config: SessionConfig) -> SessionInfo: ...

    async def verify(self, block: DraftBlock) -> VerifyResult: ...

    async def close_session(self, session_id: str) -> None: ...
