"""Position-keyed randomness, per-row sampling params, warping and inverse-CDF sampling.

Every random draw of a session is `fold_in(fold_in(session_key, position), PURPOSE)`
(docs/design.md §2): no counters and no split chains, so a session's tokens do not depend on call
order, batch mates, rollbacks or timing. Warping is applied in one order everywhere, to the
target's p and the draft's q alike: logit bias, penalties, temperature, min-p, top-k, top-p
(vLLM's order), with the tie rules of `proofs.warp`:

- logit bias adds each listed token's bias to its logit (before everything, so greedy too);
- penalties (vLLM's `apply_penalties`, greedy too) on the biased logits, given the row's
  `TokenCounts` at that position: repetition_penalty r (HF/vLLM: over prompt AND output
  tokens) divides a seen token's logit when > 0 and multiplies it otherwise; then
  frequency_penalty f and presence_penalty e (OpenAI/vLLM: output tokens only) subtract
  `f * count + e * (count > 0)`. r = 1, f = e = 0 is off (bit for bit);
- temperature 0 is greedy: a one-hot at the argmax (lowest index on ties);
- min-p keeps every token whose tempered probability is >= min_p times the largest, 0 off;
- top-k keeps every token whose logit is >= the k-th largest (boundary ties kept), k=0 off;
- top-p keeps token x iff the mass of tokens strictly more probable than x is < top_p, 1 off.

Sampling is by inverse CDF with one uniform, the first index whose cumulative probability
exceeds u, so a zero-probability token is never drawn and the exact implementation in
`proofs/` can replay a draw from the same uniform.

A row's settings are one `jaxspec.protocol.SamplingSettings` (checked when made, not here);
`SamplingParams.of` builds the `[B]` arrays the rule reads from them, in one place.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, UInt32

from jaxspec.protocol import MAX_LOGIT_BIAS, InvalidArgument, SamplingSettings

_T = TypeVar("_T")


class Purpose(enum.IntEnum):
    """What a random draw is for; folded into the position key."""

    DRAFT = 0
    ACCEPT = 1
    RESIDUAL = 2
    BONUS = 3
    TARGET = 4


# `PRNGKey` keeps 32 bits of a seed unless x64 is on: larger seeds would collide with smaller
# ones (2**32 + 5 == 5) and draw differently on an x64 verifier. One limit, checked everywhere.
SEED_LIMIT = 1 << 32


def check_seed(seed: int, name: str = "seed") -> None:
    """Raise `ValueError` unless `seed` is in [0, 2**32)."""
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{name} must be in [0, 2**32), got {seed}")


def session_key(seed: int, row: int = 0) -> UInt32[Array, "2"]:
    """Row `row`'s session key for an integer seed: `fold_in(PRNGKey(seed), row)`."""
    check_seed(int(seed))
    return jax.random.fold_in(jax.random.PRNGKey(seed), row)


def session_keys(seeds: Sequence[int] | int, rows: int) -> UInt32[Array, "B 2"]:
    """Session keys `[B, 2]`: one seed -> row i gets `fold_in(PRNGKey(seed), i)`; a list of
    seeds -> row i gets `fold_in(PRNGKey(seeds[i]), 0)`."""
    if isinstance(seeds, int | np.integer):
        check_seed(int(seeds))
        base = jax.random.PRNGKey(int(seeds))
        return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(rows))
    if len(seeds) != rows:
        raise ValueError(f"got {len(seeds)} seeds for {rows} rows")
    for s in seeds:
        check_seed(int(s))
    return jax.vmap(lambda s: jax.random.fold_in(jax.random.PRNGKey(s), 0))(
        jnp.asarray(seeds, jnp.uint32)
    )


def position_key(key: UInt32[Array, "2"], position: Int[Array, ""], purpose: int) -> jax.Array:
    """The key of the draw for `purpose` at absolute `position` of a session."""
    return jax.random.fold_in(jax.random.fold_in(key, position), purpose)


def uniforms(
    keys_B2: UInt32[Array, "B 2"], positions_BT: Int[Array, "B T"], purpose: int
) -> Float[Array, "B T"]:
    """Uniforms in [0, 1), one per (row, position), keyed by position and purpose."""

    def one(key, pos):
        return jax.random.uniform(position_key(key, pos, purpose), dtype=jnp.float32)

    return jax.vmap(jax.vmap(one, in_axes=(None, 0)))(keys_B2, positions_BT)


LogitBias = Mapping[int, float]
# The scalar fields of `SamplingSettings`, each a `[B]` column of `SamplingParams` of this
# dtype (the bias is two `[B, MAX_LOGIT_BIAS]` arrays).
_COLUMNS = (("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32),
            ("min_p", np.float32), ("repetition_penalty", np.float32),
            ("presence_penalty", np.float32), ("frequency_penalty", np.float32))  # fmt: skip
_SCALARS = tuple(name for name, _ in _COLUMNS)
# A filler row's settings (padded batch rows): every setting off, greedy.
_FILLER = SamplingSettings(temperature=0.0)


def settings_per_row(rows: int, **values: Any) -> list[SamplingSettings]:
    """`rows` `SamplingSettings` from keyword values (`SamplingSettings`' fields), each a
    scalar for every row or one per row (`logit_bias`: one map for every row, or a sequence
    of one per row); a field not given takes its default. The one place per-row keywords
    (`SamplingParams.make`, `jaxspec.generate`'s) become settings, each row checked as it is
    made (`InvalidArgument`, a `ValueError`, naming the value)."""
    unknown = set(values) - {*_SCALARS, "logit_bias"}
    if unknown:
        raise TypeError(f"not sampling settings: {sorted(unknown)}")
    columns = {}
    for name, x in values.items():
        if name == "logit_bias":
            continue
        a = np.asarray(x, dtype=object if isinstance(x, Sequence) else None)
        if a.shape not in ((), (1,), (rows,)):
            raise InvalidArgument(f"{name} has {a.shape} values for {rows} rows")
        columns[name] = np.broadcast_to(a, (rows,)).tolist()
    bias = values.get("logit_bias")
    if isinstance(bias, Sequence):
        if len(bias) != rows:
            raise InvalidArgument(f"logit_bias has {len(bias)} maps for {rows} rows")
        columns["logit_bias"] = [b or () for b in bias]
    elif bias is not None:
        columns["logit_bias"] = [bias] * rows
    made: dict[tuple, SamplingSettings] = {}  # rows alike share one (checked once)
    out = []
    for i in range(rows):
        row = {name: col[i] for name, col in columns.items()}
        key = tuple((n, id(v) if n == "logit_bias" else v) for n, v in row.items())
        if key not in made:
            made[key] = SamplingSettings(**row)
        out.append(made[key])
    return out


@flax.struct.dataclass(kw_only=True)
class SamplingParams:
    """Per-row sampling params, all array data (a new value never recompiles).

    Fields:
      temperature: `[B]` float32, >= 0; 0 is greedy.
      top_k: `[B]` int32, >= 0; 0 keeps every token.
      top_p: `[B]` float32 in (0, 1]; 1 keeps every token.
      min_p: `[B]` float32 in [0, 1]; keeps tokens with probability >= min_p * the largest
        (after temperature); 0 keeps every token.
      bias_ids: `[B, MAX_LOGIT_BIAS]` int32 token ids of the logit bias, -1 unused.
      bias_values: `[B, MAX_LOGIT_BIAS]` float32 biases added to those tokens' logits.
      repetition_penalty: `[B]` float32 in [0.01, 100]; 1 is off.
      presence_penalty, frequency_penalty: `[B]` float32; 0 is off.
      (The penalties read the row's `TokenCounts`, passed beside the params.)
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    bias_ids: jax.Array
    bias_values: jax.Array
    repetition_penalty: jax.Array | None = None
    presence_penalty: jax.Array | None = None
    frequency_penalty: jax.Array | None = None

    @classmethod
    def of(cls, settings: Sequence[SamplingSettings], rows: int | None = None) -> SamplingParams:
        """The `[rows]` arrays of per-row `SamplingSettings` (rows past them, up to `rows`
        (default: as many as there are settings), are greedy filler rows with every setting
        off): the one place the arrays are built. No checks: settings are checked when made
        (`check_vocab` aside, which the caller runs where the vocabulary is known)."""
        n = len(settings)
        R = n if rows is None else rows
        col = {}
        for name, dtype in _COLUMNS:
            a = np.full(R, getattr(_FILLER, name), dtype)
            a[:n] = [getattr(s, name) for s in settings]
            col[name] = jnp.asarray(a)
        ids = np.full((R, MAX_LOGIT_BIAS), -1, np.int32)
        vals = np.zeros((R, MAX_LOGIT_BIAS), np.float32)
        for i, s in enumerate(settings):
            if s.logit_bias:
                ids[i, : len(s.logit_bias)] = [t for t, _ in s.logit_bias]
                vals[i, : len(s.logit_bias)] = [b for _, b in s.logit_bias]
        return cls(**col, bias_ids=jnp.asarray(ids), bias_values=jnp.asarray(vals))

    @classmethod
    def make(
        cls,
        rows: int,
        temperature: float | Sequence[float] = 1.0,
        top_k: int | Sequence[int] = 0,
        top_p: float | Sequence[float] = 1.0,
        min_p: float | Sequence[float] = 0.0,
        logit_bias: LogitBias | Sequence[LogitBias | None] | None = None,
        vocab_size: int | None = None,
        repetition_penalty: float | Sequence[float] = 1.0,
        presence_penalty: float | Sequence[float] = 0.0,
        frequency_penalty: float | Sequence[float] = 0.0,
    ) -> SamplingParams:
        """`of` the settings of scalars or per-row lists (`settings_per_row`, which checks
        them; `logit_bias` is one map for every row or one per row), the biased ids also
        checked against `vocab_size` when given: a shorthand for tests and tools."""
        settings = settings_per_row(
            rows, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            logit_bias=logit_bias, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        )  # fmt: skip
        if vocab_size is not None:
            for s in dict.fromkeys(settings):
                s.check_vocab(vocab_size)
        return cls.of(settings)

    def with_penalties(self) -> SamplingParams:
        """The same params with the penalty fields filled (off) where they are None."""
        if self.repetition_penalty is not None:
            return self
        B = self.temperature.shape[0]
        return self.replace(
            repetition_penalty=jnp.ones(B, jnp.float32),
            presence_penalty=jnp.zeros(B, jnp.float32),
            frequency_penalty=jnp.zeros(B, jnp.float32),
        )

    def penalized(self) -> jax.Array:
        """`[]` bool: does any row set a penalty (False when the fields are None)."""
        if self.repetition_penalty is None:
            return jnp.asarray(False)
        return (
            jnp.any(self.repetition_penalty != 1)
            | jnp.any(self.presence_penalty != 0)
            | jnp.any(self.frequency_penalty != 0)
        )

    def pad(self, rows: int) -> SamplingParams:
        """Extend to `rows` rows with greedy filler rows (for padded batch buckets)."""
        n = rows - self.temperature.shape[0]
        s = self.with_penalties()
        return SamplingParams(
            temperature=jnp.pad(self.temperature, (0, n)),
            top_k=jnp.pad(self.top_k, (0, n)),
            top_p=jnp.pad(self.top_p, (0, n), constant_values=1.0),
            min_p=jnp.pad(self.min_p, (0, n)),
            bias_ids=jnp.pad(self.bias_ids, ((0, n), (0, 0)), constant_values=-1),
            bias_values=jnp.pad(self.bias_values, ((0, n), (0, 0))),
            repetition_penalty=jnp.pad(s.repetition_penalty, (0, n), constant_values=1.0),
            presence_penalty=jnp.pad(s.presence_penalty, (0, n)),
            frequency_penalty=jnp.pad(s.frequency_penalty, (0, n)),
        )


@flax.struct.dataclass(kw_only=True)
class TokenCounts:
    """What the penalties read: per row, which tokens the prompt holds and how often each
    token occurs in the output so far (every token committed after the prompt, then the
    block's own drafts before this position).

    Fields:
      prompt: `[B, V]` bool, the token occurs in the prompt.
      output: `[B, V]` int32, occurrences among the output tokens.
    """

    prompt: jax.Array
    output: jax.Array

    @classmethod
    def zeros(cls, rows: int, vocab: int) -> TokenCounts:
        return cls(
            prompt=jnp.zeros((rows, vocab), bool), output=jnp.zeros((rows, vocab), jnp.int32)
        )

    @classmethod
    def of(
        cls,
        tokens_BS: Int[Array, "B S"],
        prompt_len_B: Int[Array, " B"],
        length_B: Int[Array, " B"],
        vocab: int,
    ) -> TokenCounts:
        """Counts of each row's context `tokens[:length]`, its first `prompt_len` the prompt."""
        B, S = tokens_BS.shape
        cols = jnp.arange(S)[None, :]
        rows = jnp.arange(B)[:, None]
        tok = jnp.clip(tokens_BS, 0, vocab - 1)
        in_prompt = cols < jnp.minimum(prompt_len_B, length_B)[:, None]
        in_output = (cols >= prompt_len_B[:, None]) & (cols < length_B[:, None])
        prompt = (
            jnp.zeros((B, vocab), bool)
            .at[rows, jnp.where(in_prompt, tok, vocab)]
            .set(True, mode="drop")
        )
        output = jnp.zeros((B, vocab), jnp.int32).at[rows, tok].add(in_output.astype(jnp.int32))
        return cls(prompt=prompt, output=output)

    def add(
        self, tokens_BN: Int[Array, "B N"], count_B: Int[Array, " B"] | None = None
    ) -> TokenCounts:
        """These counts with each row's first `count[b]` of `tokens` (all when None) added to
        its output."""
        B, N = tokens_BN.shape
        V = self.output.shape[-1]
        use = tokens_BN >= 0
        if count_B is not None:
            use = use & (jnp.arange(N)[None, :] < count_B[:, None])
        ids = jnp.where(use, tokens_BN, V)  # V: out of range, dropped
        rows = jnp.arange(B)[:, None]
        return self.replace(output=self.output.at[rows, ids].add(1, mode="drop"))

    def per_position(self, drafts_BK: Int[Array, "B K"], positions: int) -> TokenCounts:
        """`[B * positions]` rows: position i of each block sees these counts plus the drafts
        d_0 .. d_{i-1} (i < positions <= K + 1), row-major like `reshape(B * positions)`."""
        B = drafts_BK.shape[0]
        V = self.output.shape[-1]
        oh = jax.nn.one_hot(jnp.where(drafts_BK >= 0, drafts_BK, V), V, dtype=jnp.int32)
        inclusive = jnp.cumsum(oh, axis=1)  # [B, K, V]: drafts up to and including i
        before = jnp.concatenate([jnp.zeros_like(oh[:, :1]), inclusive], axis=1)[:, :positions]
        out = self.output[:, None, :] + before
        prompt = jnp.broadcast_to(self.prompt[:, None, :], out.shape)
        return TokenCounts(
            prompt=prompt.reshape(B * positions, V), output=out.reshape(B * positions, V)
        )


def warp(
    logits_BV: Float[Array, "B V"],
    params: SamplingParams,
    counts: TokenCounts | None = None,
    *,
    options: bool = True,
) -> Float[Array, "B V"]:
    """The distribution sampled from: logit bias, penalties, temperature, min-p, top-k,
    top-p, in this order (module doc). The penalties need each row's `counts` (without them
    the penalties are not applied: every caller that takes penalised params passes them).
    `options=False` leaves out the logit bias and min-p (a test hook for the mutant that
    sends q warped without them).

    Work a batch does not need is skipped with `lax.cond` (a scalar predicate over the
    batch): no softmax when every row is greedy, no sorting when no row filters. The
    result is the same either way; decoding steps on CPU are dominated by such small ops.
    """
    V = logits_BV.shape[-1]
    if options:
        logits_BV = cond(
            jnp.any(params.bias_ids >= 0), lambda x: _add_bias(x, params), lambda x: x, logits_BV
        )
    if counts is not None and params.repetition_penalty is not None:
        logits_BV = cond(
            params.penalized(), lambda x: _penalize(x, params, counts), lambda x: x, logits_BV
        )
    t = params.temperature.astype(logits_BV.dtype)[:, None]
    greedy = jax.nn.one_hot(argmax(logits_BV), V, dtype=logits_BV.dtype)

    def sampled(_):
        scaled = logits_BV / jnp.where(t > 0, t, 1)
        # A tiny temperature can overflow the division (100 / 1e-37 = +inf, then the
        # softmax's inf - inf is NaN and the sampler gave token 0). Such a row is tempered
        # from its largest logit instead (shift-invariant: the same distribution, now
        # finite); every other row keeps its exact values.
        top_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
        shifted = (logits_BV - top_B1) / jnp.where(t > 0, t, 1)
        overflow_B1 = jnp.any(scaled == jnp.inf, axis=-1, keepdims=True)
        scaled = jnp.where(overflow_B1, shifted, scaled)
        if options:
            scaled = cond(
                jnp.any(params.min_p > 0), lambda x: _min_p(x, params), lambda x: x, scaled
            )
        filters = jnp.any(params.top_k > 0) | jnp.any(params.top_p < 1)
        probs = cond(
            filters,
            lambda s: _top_k_top_p(s, params),
            lambda s: jax.nn.softmax(s, axis=-1),
            scaled,
        )
        return jnp.where(t > 0, probs, greedy)

    return cond(jnp.all(t == 0), lambda _: greedy, sampled, None)


def argmax(x: Float[Array, "... V"]) -> Int[Array, "..."]:
    """`jnp.argmax(x, axis=-1)` as int32, the same index in every case (the lowest on ties, the
    first NaN where there is one), in two passes XLA:CPU vectorizes: the maximum, then the
    lowest index holding it. `jnp.argmax` is one variadic reduce (value and index) that it
    does not: ~240 us over SmolLM2's 49,152 logits against ~60, and a speculative round takes
    one per draft and per verified position."""
    top = jnp.max(x, axis=-1, keepdims=True)  # NaN if any entry is NaN
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    at_top = (x == top) | jnp.isnan(x)
    return jnp.min(jnp.where(at_top, iota, x.shape[-1]), axis=-1)


def _add_bias(logits_BV: jax.Array, params: SamplingParams) -> jax.Array:
    """logits + bias at each row's biased ids (unused slots, id -1, add nothing)."""
    B, V = logits_BV.shape
    ids = jnp.where(params.bias_ids >= 0, params.bias_ids, V)  # V: out of range, dropped
    rows = jnp.arange(B)[:, None]
    return logits_BV.at[rows, ids].add(params.bias_values.astype(logits_BV.dtype), mode="drop")


def _penalize(logits_BV: jax.Array, params: SamplingParams, counts: TokenCounts) -> jax.Array:
    """vLLM's `apply_penalties`: repetition (prompt or output tokens: positive logits divided,
    the others multiplied), then frequency (times the output count) and presence (output
    tokens) subtracted. Rows with r = 1, f = e = 0 come out bit for bit unchanged."""
    dtype = logits_BV.dtype
    seen = counts.prompt | (counts.output > 0)
    r = jnp.where(seen, params.repetition_penalty.astype(dtype)[:, None], 1)
    x = jnp.where(logits_BV > 0, logits_BV / r, logits_BV * r)
    x = x - params.frequency_penalty.astype(dtype)[:, None] * counts.output.astype(dtype)
    x = x - params.presence_penalty.astype(dtype)[:, None] * (counts.output > 0).astype(dtype)
    # Never +-inf, whatever the params (an inf logit makes the softmax NaN): the identity on
    # every finite value, so within the checked ranges nothing changes.
    big = jnp.finfo(dtype).max
    return jnp.clip(x, -big, big)


def _min_p(scaled_BV: jax.Array, params: SamplingParams) -> jax.Array:
    """Drop (-inf) tokens whose tempered probability is below min_p times the largest; the
    argmax always stays, ties at the threshold stay."""
    probs = jax.nn.softmax(scaled_BV, axis=-1)
    floor = params.min_p.astype(probs.dtype)[:, None] * jnp.max(probs, axis=-1, keepdims=True)
    return jnp.where(probs >= floor, scaled_BV, -jnp.inf)


def cond(
    pred: Any, true_fn: Callable[[Any], _T], false_fn: Callable[[Any], _T], operand: Any
) -> _T:
    """`jax.lax.cond(pred, true_fn, false_fn, operand)` under a trace; on a concrete `pred` a
    plain `if` that calls only the branch taken. The sampler, the verification rule and the
    drafter skip work a batch does not need (penalties, min-p, top-k/top-p) this way both in
    jitted steps and in eager calls; eager calls then compile nothing (an eager float64
    `lax.cond` once crashed XLA's CPU compiler in our suite)."""
    if isinstance(pred, jax.core.Tracer):
        return jax.lax.cond(pred, true_fn, false_fn, operand)
    return true_fn(operand) if bool(pred) else false_fn(operand)


# The top-k / top-p cuts are looked for among this many largest values first, then this
# many, then in the whole sorted row.
TIERS = (256, 4096)
FAST_MARGIN = 2.0**-20  # top_p below a tier's mass by this: no value past the tier counts


def _descending(x_BV: jax.Array, n: int) -> jax.Array:
    """The `n` largest values of each row, largest first (`n` >= V: the whole row sorted)."""
    if n >= x_BV.shape[-1]:
        return -jnp.sort(-x_BV, axis=-1)
    return jax.lax.top_k(x_BV, n)[0]


def _from_tiers(x_BV: jax.Array, read: Callable, tiers: tuple[int, ...] = TIERS) -> jax.Array:
    """`read(desc)` -> (value, enough) on the largest `tiers[0]` values of each row (largest
    first); while any row's is not `enough`, the same on the next tier, and last on the whole
    sorted row (its value taken as it is)."""
    V = x_BV.shape[-1]
    n = tiers[0] if tiers else V
    value, enough = read(_descending(x_BV, n))
    if n >= V:
        return value
    return cond(jnp.all(enough), lambda _: value, lambda x: _from_tiers(x, read, tiers[1:]), x_BV)


def _top_k_top_p(scaled_BV: jax.Array, params: SamplingParams) -> jax.Array:
    """softmax of temperature-scaled logits with top-k, then top-p applied (tie rules above).

    Both cuts are read off the values in descending order. Sorting a whole row (49,152
    logits: ~11 ms on a CPU core, twice a position) cost more than the model's step, so the
    largest 256 come first (`lax.top_k`, ~0.2 ms), then 4,096, and the whole sort runs only
    for a batch that needs more (`_from_tiers`): a top_k past them, or a row whose top values
    hold less than its top_p (plus `FAST_MARGIN`, past float rounding of the running sum).
    The cuts are the same values either way (a tier is the sorted row's first values, and
    the running sum's first terms are the same sums), so the result is bit for bit the
    whole sort's."""
    k_B1 = params.top_k[:, None]

    def kth(desc):
        """The k-th largest value (k clipped to what `desc` holds); enough where k fits."""
        n = desc.shape[-1]
        return jnp.take_along_axis(desc, jnp.clip(k_B1, 1, n) - 1, axis=-1), k_B1 <= n

    kth_B1 = cond(
        jnp.any(params.top_k > 0),
        lambda s: _from_tiers(s, kth),
        lambda s: jnp.zeros_like(s[:, :1]),  # no row cuts: the value is not read
        scaled_BV,
    )
    keep_k = (k_B1 == 0) | (scaled_BV >= kth_B1)
    probs = jax.nn.softmax(jnp.where(keep_k, scaled_BV, -jnp.inf), axis=-1)
    top_p = params.top_p.astype(probs.dtype)[:, None]

    def cut(p_desc):
        """The smallest probability kept (the last in descending order whose mass above is
        below top_p); enough where the values read hold top_p and the margin."""
        running = jnp.cumsum(p_desc, axis=-1)
        n_in = jnp.sum(running - p_desc < top_p, axis=-1, keepdims=True)  # mass above
        value = jnp.take_along_axis(p_desc, jnp.maximum(n_in - 1, 0), axis=-1)
        return value, (top_p >= 1) | (running[:, -1:] >= top_p + FAST_MARGIN)

    cut_B1 = cond(
        jnp.any(params.top_p < 1),
        lambda p: _from_tiers(p, cut),
        lambda p: jnp.zeros_like(p[:, :1]),
        probs,
    )
    keep_p = (top_p >= 1) | (probs >= cut_B1)
    probs = jnp.where(keep_p, probs, 0)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)


def sample(probs_BV: Float[Array, "B V"], u_B: Float[Array, " B"]) -> Int[Array, " B"]:
    """Inverse-CDF draw: the first token whose cumulative probability exceeds `u * total`."""
    cum = jnp.cumsum(probs_BV, axis=-1)
    threshold = u_B.astype(cum.dtype) * cum[:, -1]
    idx = jnp.sum(cum <= threshold[:, None], axis=-1)
    V = probs_BV.shape[-1]
    last_nonzero = V - 1 - jnp.argmax((probs_BV > 0)[:, ::-1], axis=-1)
    return jnp.minimum(idx, last_nonzero).astype(jnp.int32)


def sample_at(
    logits_BV: Float[Array, "B V"],
    params: SamplingParams,
    keys_B2: UInt32[Array, "B 2"],
    positions_B: Int[Array, " B"],
    purpose: int = Purpose.TARGET,
    counts: TokenCounts | None = None,
) -> Int[Array, " B"]:
    """Sample each row's token for absolute `positions_B` with its position-keyed uniform."""
    u = uniforms(keys_B2, positions_B[:, None], purpose)[:, 0]
    return sample(warp(logits_BV, params, counts), u)
