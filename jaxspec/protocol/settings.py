"""How a session drafts and samples: `DraftSpec` (gamma, the encoding of q, its dtype) and
`SamplingSettings` (the warps of p and q alike), each checked as it is made (`InvalidArgument`
naming the bad field), with the bounds the protocol puts on them."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import numpy as np

from jaxspec.protocol.errors import InvalidArgument

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
# The repetition penalty's range: a factor of at most 100 either way. vLLM and HF take any
# r > 0 and use (0, 2] in practice (1.1-1.3 is usual, below 1 rewards repetition); a tiny r
# divided a seen token's positive logit into +inf (r = 1e-40: 5 / 1e-40 overflows float32)
# and the softmax into NaN. Within [1/100, 100] a logit changes by at most 100 times, far
# from float32's range (3.4e38) for any logit a model computes. Compared as float32, so the
# wire's 0.01 (a float32 a hair below 0.01) is accepted.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
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
    (vLLM's semantics): repetition_penalty within REPETITION_PENALTY_RANGE, [0.01, 100] (1
    off), over prompt and output tokens, presence and frequency finite within +-PENALTY_LIMIT
    (0 off) over output tokens.

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
        lo, hi = (_float32(b) for b in REPETITION_PENALTY_RANGE)
        if not math.isfinite(r) or not lo <= _float32(r) <= hi:
            raise InvalidArgument(
                f"repetition_penalty must be within [{lo:g}, {hi:g}] (1 = off), got {r}"
            )
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
