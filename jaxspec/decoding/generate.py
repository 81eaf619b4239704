"""Plain autoregressive decoding: the exact reference decoder later layers compare against.

A batch of prompts of different lengths is right-padded into a bucketed `[B, T]` array,
prefilled in one forward, then decoded by one jitted `lax.while_loop` that stops when every
row has hit a stop token or `max_new_tokens`. The token at absolute position P of row i is
drawn with the uniform keyed by (row key, P, TARGET), so a row's output does not depend on
the batch it is decoded in (up to floating-point near-ties, docs/design.md §2).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, UInt32

from jaxspec.compilation import trace_cache
from jaxspec.compilation.shapes import bucket
from jaxspec.compilation.traces import traces
from jaxspec.decoding import analytic, costs
from jaxspec.decoding.sampling import (
    Purpose,
    SamplingParams,
    TokenCounts,
    sample_at,
    session_keys,
    settings_per_row,
)
from jaxspec.decoding.speculative import DecodeBatch, SpecCounters, speculative_decode
from jaxspec.figures import AcceptanceFigures
from jaxspec.nn.model import KVCache, Llama, Model, init_cache
from jaxspec.protocol import MODES, DraftSpec, SamplingSettings

PromptIds = Sequence[int] | Sequence[Sequence[int]] | np.ndarray
AUTO = "auto"  # generate(gamma="auto"): measure the pair and pick one gamma
AUTO_LONGEST_BLOCK = 8  # the longest block gamma="auto" considers (an adaptive spec says)
PROBE_TOKENS = 16  # new tokens of each measuring run of gamma="auto"


@dataclasses.dataclass(frozen=True)
class GammaChoice:
    """What `generate(gamma="auto")` measured and the gamma it picked (`GenerateStats.auto`).

    Fields: `gamma` (picked, in 0..`longest`; 0: plain decoding beats every block);
    `draft_s`, `draft2_s`: a draft forward of one and of two positions (the first of a block
    after a fully accepted one), `target_s`: a target forward of one position (a plain
    decoding step), `verify_s`: the target's forward of the gamma + 1 positions a block of
    gamma drafts is verified with, for gamma 1..`longest`; all seconds inside a jitted loop
    (`jaxspec.decoding.costs`, measured once per process). `alphas`: the acceptance of each
    draft position given the earlier ones were accepted, and `acceptance_rate`, from a probe
    run of `probe_tokens` at `longest` on the call's rows, or (`probe_tokens` 0) from the
    pair's earlier speculative calls in this process (`pair_acceptance`)."""

    gamma: int
    longest: int
    draft_s: float
    target_s: float
    alphas: tuple[float, ...]
    acceptance_rate: float
    probe_tokens: int
    draft2_s: float = 0.0
    verify_s: tuple[float, ...] = ()

    def token_s(self, gamma: int, mode: str = "sync", new_tokens: int | None = None) -> float:
        """The model's expected seconds per token at `gamma` (0: plain decoding): a round of
        gamma drafts costs gamma draft forwards (the first two positions wide after a fully
        accepted sync block: probability `survival[gamma]`) and the verify forward of gamma +
        1 positions, and yields E[A] tokens (`jaxspec.decoding.analytic`). With `new_tokens`,
        a call of that many: whole rounds, ceil(new_tokens / E[A]) of them (the last one's
        drafts past the end are work for nothing), over its tokens."""
        if gamma == 0:
            return self.target_s
        alphas = list(self.alphas) or [0.0]
        lag = analytic.survival(alphas, gamma)[gamma] if mode == "sync" else 0.0
        draft = (gamma * self.draft_s + lag * (self.draft2_s - self.draft_s)) / gamma
        per_token = analytic.colocated_token_time(gamma, alphas, draft, self.verify_s[gamma - 1])
        if new_tokens is None:
            return per_token
        per_round = analytic.expected_tokens(alphas, gamma)
        return math.ceil(new_tokens / per_round - 1e-9) * per_token * per_round / new_tokens

    def describe(self) -> str:
        """The figures in words (what `jaxspec generate --gamma auto` prints)."""
        seen = (
            f"over {self.probe_tokens} probe tokens at gamma={self.longest}"
            if self.probe_tokens
            else "over this pair's earlier calls"
        )
        verify = f", verify of gamma={self.longest} {self.verify_s[-1] * 1e3:.1f} ms" * bool(
            self.verify_s
        )
        return (
            f"draft {self.draft_s * 1e3:.1f} ms/token, target {self.target_s * 1e3:.1f} "
            f"ms/token{verify}, acceptance {self.acceptance_rate:.2f} {seen}"
        )


@dataclasses.dataclass(frozen=True)
class GenerateStats:
    """What a `generate` call did, with compilation and generation timed apart.

    `wall_s` is the time spent decoding (compilation excluded) and `tokens_per_s` the new
    tokens over it: the speed a second call with the same shapes gets. `compile_s` is the time
    spent tracing and compiling shapes met for the first time (0.0 when every shape was
    compiled already); `compiled` says whether any was. `figures` holds the speculative-decoding
    totals (`AcceptanceFigures`) when a draft was used (None for plain decoding), `gamma` the
    drafts per round (None for plain decoding) and `auto` what `gamma="auto"` measured to
    pick it (`GammaChoice`; its probe runs are not in `wall_s` or `compile_s`)."""

    num_rows: int
    new_tokens: int
    wall_s: float
    compiled: bool
    figures: AcceptanceFigures | None = None
    compile_s: float = 0.0
    gamma: int | None = None
    auto: GammaChoice | None = None

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of decoding (compilation excluded)."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    """New tokens only. `tokens` is a list of ints for a single prompt, else one list per
    row (each ends at its stop token, included); `padded` is `[B, N]` int32, -1 padded."""

    tokens: list[int] | list[list[int]]
    padded: np.ndarray
    stats: GenerateStats


def normalize_prompts(prompt_ids: PromptIds, vocab_size: int) -> tuple[list[list[int]], bool]:
    """Prompts as a list of int lists, and whether a single sequence was given."""
    arr = prompt_ids
    if isinstance(arr, np.ndarray | jax.Array):
        arr = np.asarray(arr)
        if arr.ndim not in (1, 2):
            raise ValueError(f"prompt_ids must be 1-D or 2-D, got shape {arr.shape}")
        single = arr.ndim == 1
        rows = [arr.tolist()] if single else arr.tolist()
    else:
        if len(arr) == 0:
            raise ValueError("prompt_ids is empty")
        single = isinstance(arr[0], int | np.integer)
        rows = [list(arr)] if single else [list(r) for r in arr]
    for i, r in enumerate(rows):
        if not r:
            raise ValueError(f"prompt {i} is empty; give at least one token (e.g. BOS)")
        bad = [t for t in r if not 0 <= int(t) < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
    return [[int(t) for t in r] for r in rows], single


def generate(
    model: Model,
    prompt_ids: PromptIds,
    max_new_tokens: int = 64,
    *,
    temperature: float | Sequence[float] | None = None,
    top_k: int | Sequence[int] | None = None,
    top_p: float | Sequence[float] | None = None,
    min_p: float | Sequence[float] | None = None,
    logit_bias: Mapping[int, float] | Sequence[Mapping[int, float] | None] | None = None,
    repetition_penalty: float | Sequence[float] | None = None,
    presence_penalty: float | Sequence[float] | None = None,
    frequency_penalty: float | Sequence[float] | None = None,
    sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    stop_tokens: Sequence[int] | None = None,
    draft: Model | None = None,
    gamma: int | str = 4,
    mode: str = "sync",
    encoding: str = "full",
    sparse_k: int = 8,
    q_dtype: str = "float32",
    draft_spec: DraftSpec | None = None,
    max_batch: int = 256,
) -> GenerateOutput:
    """Decode `max_new_tokens` new tokens for one prompt or a batch of prompts.

    Args:
      model: the target model.
      prompt_ids: one sequence of token ids, a list of sequences of different lengths, or
        a 2-D array (every row taken whole).
      temperature, top_k, top_p, min_p: scalars or one value per row; temperature 0 is
        greedy, min_p 0 is off. The sampling keywords are `sampling`'s shorthand: one left
        out (None) takes `SamplingSettings`' default (temperature 1, every filter off).
      logit_bias: `{token id: bias}` added to the logits before everything (greedy too), one
        map for every row or one per row (at most 32 entries, each within +-100).
      repetition_penalty, presence_penalty, frequency_penalty: scalars or one value per row
        (vLLM's semantics, applied after the logit bias, before temperature; greedy too):
        repetition (within [0.01, 100], 1 off) over prompt and output tokens divides positive
        logits and multiplies the others; presence and frequency (within +-2, 0 off) over the
        output tokens subtract `presence * (count > 0) + frequency * count`. Lossless under
        speculation: draft and target both read the counts of the committed tokens plus
        the block's earlier drafts.
      sampling: `SamplingSettings` for every prompt, or one per prompt (not with the keywords).
      seed: row i's session key is `fold_in(PRNGKey(seed), i)`; `seeds` gives each row its own.
      stop_tokens: ids that end a row (kept in its output); default: the config's EOS ids.
      draft: a draft model sharing the target's vocabulary turns on co-located speculative
        decoding: `gamma` drafts per round, `mode` "sync" (bonus token after a fully
        accepted block) or "pipelined" (no bonus), the draft q sent as `encoding` "full",
        "sparse" (top-`sparse_k`) or "onehot" (greedy drafts), validated as one
        `jaxspec.DraftSpec` (or give that `draft_spec` in place of the four keywords).
        Lossless: the output is distributed exactly as plain decoding's.
        `q_dtype="float16"` drafts from q rounded to float16 (times one float32 scale per
        draft), as an edge session of that `q_dtype` does: the same tokens as that session.
        `gamma=0` is speculation off: plain decoding, the draft unused (`stats.figures` None),
        as an edge session of gamma 0 gets the same tokens from the verifier. `gamma="auto"`
        decodes with the gamma in 1..8 (`DraftSpec(gamma=L, adaptive=True)`: 1..L) that
        `choose_gamma` picks, recorded in `stats.gamma` (the measurements: `stats.auto`).
      max_batch: rows decoded per jitted call; larger batches run in chunks.
    """
    rows, single = normalize_prompts(prompt_ids, model.config.vocab_size)
    _check_length(model, rows, max_new_tokens)
    knobs = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, logit_bias=logit_bias,
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
    )  # fmt: skip
    params = _sampling_rows(sampling, knobs, len(rows), model.config.vocab_size)
    kw = dict(gamma=gamma, encoding=encoding, sparse_k=sparse_k, q_dtype=q_dtype)
    spec = None if draft is None else _draft_spec(model, draft, mode, draft_spec, kw)
    stops = model.config.eos_token_ids if stop_tokens is None else tuple(stop_tokens)
    keys = session_keys(seed if seeds is None else list(seeds), len(rows))
    out, stats = decode(
        model, rows, max_new_tokens, params, keys, stops, draft=draft, spec=spec, mode=mode,
        max_batch=max_batch,
    )  # fmt: skip
    lists = [r[r >= 0].tolist() for r in out]
    return GenerateOutput(tokens=lists[0] if single else lists, padded=out, stats=stats)


def decode(
    model: Model,
    rows: list[list[int]],
    max_new_tokens: int,
    sampling: SamplingParams,
    keys: UInt32[Array, "B 2"],
    stop_tokens: Sequence[int],
    *,
    draft: Model | None = None,
    spec: DraftSpec | None = None,
    mode: str = "sync",
    max_batch: int = 256,
) -> tuple[np.ndarray, GenerateStats]:
    """`generate` below its checks: the validated objects in, `[B, max_new_tokens]` new tokens
    (-1 padded) and the stats out. An adaptive `spec` (gamma="auto") becomes the fixed one of
    the gamma `choose_gamma` picks, measured on the first chunk (the batch shape decoded; not
    timed in the stats)."""
    if draft is not None and (spec is None or not spec.speculative):
        draft, spec = None, None  # gamma 0: speculation off, plain decoding (draft unused)
    head = rows[:max_batch]
    spec, auto = _picked(
        model, draft, head, sampling, keys, stop_tokens, spec, mode, max_new_tokens
    )
    if auto is not None and auto.gamma == 0:
        draft, spec = None, None  # speculation cannot pay: plain decoding
    n = len(rows)
    stop_arr = jnp.asarray(list(stop_tokens) or [-1], jnp.int32)
    out = np.full((n, max_new_tokens), -1, np.int32)
    compile_s, compiled, figures = 0.0, False, None
    start = time.perf_counter()
    for lo in range(0, n, max_batch):
        hi = min(n, lo + max_batch)
        chunk, counters, lowering_s, traced = _run_chunk(
            model, draft, rows[lo:hi], sampling, keys, lo, hi, stop_arr, max_new_tokens,
            spec=spec, mode=mode,
        )  # fmt: skip
        out[lo:hi] = chunk
        if traced:  # a new shape: its lowering was a compilation
            compiled, compile_s = True, compile_s + lowering_s
        if counters is not None:
            part = counters.to_figures()
            figures = part if figures is None else figures + part
    if draft is not None:
        _remember(_pair_key(model, draft, sampling, mode), figures)
    stats = GenerateStats(
        num_rows=n,
        new_tokens=int(np.sum(out >= 0)),
        wall_s=time.perf_counter() - start - compile_s,
        compiled=compiled,
        figures=figures,
        compile_s=compile_s,
        gamma=auto.gamma if auto is not None else None if draft is None else spec.gamma,
        auto=auto,
    )
    return out, stats


def _picked(
    model: Model,
    draft: Model | None,
    rows: list[list[int]],
    sampling: SamplingParams,
    keys: UInt32[Array, "B 2"],
    stop_tokens: Sequence[int],
    spec: DraftSpec | None,
    mode: str,
    max_new: int,
) -> tuple[DraftSpec | None, GammaChoice | None]:
    """`spec` as it is, or for an adaptive one (gamma="auto") the fixed spec of the gamma
    `choose_gamma` picks on `rows` (probes of at most `max_new` tokens), and that choice."""
    if draft is None or spec is None or not spec.adaptive:
        return spec, None
    probe = min(PROBE_TOKENS, max_new)
    auto = choose_gamma(
        model, draft, rows, sampling, keys, stop_tokens, spec, mode=mode, probe_tokens=probe,
        new_tokens=max_new,
    )  # fmt: skip
    return dataclasses.replace(spec, gamma=auto.gamma, adaptive=False), auto


def _draft_spec(
    model: Model, draft: Model, mode: str, given: DraftSpec | None, kw: dict[str, Any]
) -> DraftSpec:
    """The checked `DraftSpec` of `generate`'s keywords `kw` (or `given`): gamma="auto" is an
    adaptive spec whose gamma is the longest block, `AUTO_LONGEST_BLOCK`."""
    spec = given
    if spec is None and kw["gamma"] == AUTO:
        spec = DraftSpec(**{**kw, "gamma": AUTO_LONGEST_BLOCK}, adaptive=True)
    elif spec is None:
        if isinstance(kw["gamma"], str):
            raise ValueError(f"gamma must be an integer or {AUTO!r}, got {kw['gamma']!r}")
        spec = DraftSpec(**kw)
    _speculative_spec(model, draft, mode, dataclasses.replace(spec, adaptive=False))
    return spec


def conditional_alphas(reached: Sequence[float]) -> list[float]:
    """Per draft position i, P(draft i accepted | drafts before it accepted), from the
    fraction of rounds whose draft i was accepted (`per_position_acceptance`: every draft up
    to i accepted) — the acceptance `jaxspec.decoding.analytic` takes per position."""
    out, before = [], 1.0
    for r in reached:
        out.append(min(1.0, r / before) if before > 0 else 0.0)
        before = r
    return out


def choose_gamma(
    model: Model,
    draft: Model,
    rows: list[list[int]],
    sampling: SamplingParams,
    keys: UInt32[Array, "B 2"],
    stop_tokens: Sequence[int],
    spec: DraftSpec,
    *,
    mode: str = "sync",
    probe_tokens: int = PROBE_TOKENS,
    new_tokens: int | None = None,
) -> GammaChoice:
    """`gamma="auto"`: the gamma in 0..`spec.gamma` with the least expected time per token
    under the co-located model (`jaxspec.decoding.analytic`: a round of gamma drafts costs
    gamma draft forwards, the first two positions wide after a fully accepted sync block, and
    one target forward of gamma + 1 positions; it yields E[A] tokens; 0 is plain decoding at
    one target forward per token), fed with measured figures: each forward's seconds inside a
    jitted loop (`jaxspec.decoding.costs`, once per process) and the acceptance per draft
    position: the pair's acceptance over its earlier speculative calls in this process at
    these sampling settings' kind (greedy or sampled; `pair_acceptance`), or where it has none
    yet, a probe run at `spec.gamma` (the longest block) on these rows of at most
    `probe_tokens`. `new_tokens` (the call's `max_new_tokens`): priced as whole rounds
    (`GammaChoice.token_s`). `sampling` and `keys` may have more rows than `rows`
    (`generate` measures its first chunk)."""
    head = jax.tree.map(lambda a: a[: len(rows)], (sampling, keys))
    L = spec.gamma
    d = costs.forward_seconds(draft, (1, 2))
    v = costs.forward_seconds(model, sorted({1, L // 2 + 1, L + 1}))
    seen, probed = pair_acceptance(model, draft, head[0], mode), 0
    if seen is None:  # the probe's own call pools its figures (`decode`)
        longest = dataclasses.replace(spec, adaptive=False)
        common = (rows, probe_tokens, *head, stop_tokens)
        figures = decode(model, *common, draft=draft, spec=longest, mode=mode)[1].figures
        seen, probed = PairAcceptance.of(figures or AcceptanceFigures()), probe_tokens
    verify = tuple(costs.interpolated(v, g + 1) for g in range(1, L + 1))
    measured = GammaChoice(
        gamma=L, longest=L, draft_s=d[1], target_s=v[1], alphas=tuple(seen.alphas),
        acceptance_rate=seen.acceptance_rate, probe_tokens=probed, draft2_s=d[2],
        verify_s=verify,
    )  # fmt: skip
    best = min(range(L + 1), key=lambda g: (measured.token_s(g, mode, new_tokens), g))
    return dataclasses.replace(measured, gamma=best)


@dataclasses.dataclass(frozen=True)
class PairAcceptance:
    """A pair's acceptance pooled over its speculative calls in this process: per draft
    position i, `hits[i]` rounds whose drafts 0..i were accepted out of `tries[i]` that
    tested draft i with drafts 0..i-1 accepted; `accepted` / `drafted` drafts overall. Older
    calls count half at each new one, so the figures follow text whose acceptance moves."""

    hits: tuple[float, ...] = ()
    tries: tuple[float, ...] = ()
    accepted: float = 0.0
    drafted: float = 0.0

    @classmethod
    def of(cls, f: AcceptanceFigures) -> PairAcceptance:
        app = list(f.accepted_per_position)
        return cls(
            hits=tuple(float(x) for x in app),
            tries=tuple(float(x) for x in [f.num_drafts, *app[:-1]]),
            accepted=float(f.num_accepted_tokens),
            drafted=float(f.num_draft_tokens),
        )

    def __add__(self, new: PairAcceptance) -> PairAcceptance:
        """These figures halved, plus `new`'s."""
        n = max(len(self.hits), len(new.hits))

        def pad(x: tuple[float, ...], w: float) -> list[float]:
            return [w * v for v in x] + [0.0] * (n - len(x))

        def pooled(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(x + y for x, y in zip(pad(a, 0.5), pad(b, 1.0), strict=True))

        return PairAcceptance(
            hits=pooled(self.hits, new.hits), tries=pooled(self.tries, new.tries),
            accepted=self.accepted / 2 + new.accepted, drafted=self.drafted / 2 + new.drafted,
        )  # fmt: skip

    @property
    def alphas(self) -> list[float]:
        """P(draft i accepted | drafts before it accepted), for the positions ever tested."""
        return [min(1.0, h / t) for h, t in zip(self.hits, self.tries, strict=True) if t > 0]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


_ACCEPTANCE = costs.PerWeights()  # per (target, draft) weights, mode and greedy or not


def _pair_key(
    model: Model, draft: Model, sampling: SamplingParams, mode: str
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    greedy = bool(np.all(np.asarray(sampling.temperature) == 0))
    return (model.params, draft.params), (mode, greedy)


def pair_acceptance(
    model: Model, draft: Model, sampling: SamplingParams, mode: str
) -> PairAcceptance | None:
    """The pooled acceptance of this pair's speculative calls in this process (None before
    any) at `sampling`'s kind (every row greedy, or not): the figures `gamma="auto"` uses."""
    return _ACCEPTANCE.get(*_pair_key(model, draft, sampling, mode))


def _remember(
    key: tuple[tuple[Any, ...], tuple[Any, ...]], figures: AcceptanceFigures | None
) -> None:
    """Pool one call's figures into its pair's (`PairAcceptance`)."""
    if figures is None or not figures.num_drafts:
        return
    new = PairAcceptance.of(figures)
    old = _ACCEPTANCE.get(*key)
    _ACCEPTANCE.put(*key, new if old is None else old + new)


def _check_length(model: Model, rows: list[list[int]], max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    longest = max(len(r) for r in rows) + max_new_tokens
    if longest > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt + max_new_tokens = {longest} exceeds the model's "
            f"max_position_embeddings = {model.config.max_position_embeddings}"
        )


def _sampling_rows(
    sampling: SamplingSettings | Sequence[SamplingSettings] | None,
    knobs: dict[str, Any],
    n: int,
    vocab: int,
) -> SamplingParams:
    """`n` rows of sampling arrays: of `sampling` (one for every row, or n), or of the
    sampling keywords given (not None; `settings_per_row` makes and checks them: the one
    place they become settings). Both is a `ValueError`; each distinct settings' bias ids
    are checked against the vocabulary once."""
    given = {k: v for k, v in knobs.items() if v is not None}
    if sampling is None:
        settings = settings_per_row(n, **given)
    elif given:
        raise ValueError(f"give sampling= or the sampling keywords, not both (got {sorted(given)})")
    elif isinstance(sampling, SamplingSettings):
        settings = [sampling] * n
    else:
        settings = list(sampling)
        if len(settings) != n or not all(isinstance(s, SamplingSettings) for s in settings):
            raise ValueError(
                f"sampling must be one SamplingSettings or one per prompt ({n}), got {sampling!r}"
            )
    for s in dict.fromkeys(settings):
        s.check_vocab(vocab)
    return SamplingParams.of(settings)


def _speculative_spec(model: Model, draft: Model, mode: str, spec: DraftSpec) -> DraftSpec:
    """`spec`, checked (it raises `InvalidArgument`, a `ValueError`) against the target's
    vocabulary, which the draft must share; `mode` must be one of `MODES`."""
    if draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the target's "
            f"({model.config.vocab_size})"
        )
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    spec.check(vocab_size=model.config.vocab_size)
    return spec


def _run_chunk(
    model: Model,
    draft: Model | None,
    rows: list[list[int]],
    params: SamplingParams,
    keys: jax.Array,
    lo: int,
    hi: int,
    stop_arr: jax.Array,
    max_new: int,
    *,
    spec: DraftSpec | None,
    mode: str,
) -> tuple[np.ndarray, SpecCounters | None, float, bool]:
    """Pad one chunk to its bucket and run the jitted decoder: `[hi - lo, max_new]` tokens,
    for speculative decoding (`spec` given) its counters, the seconds spent lowering and
    compiling ahead of the run (a cache lookup when the shape is compiled already), and
    whether that lowering traced (a shape met for the first time).

    The decoder is compiled with `.lower(...).compile()` before it is called, so its run is
    timed without the compilation: the jitted call then finds the executable in JAX's
    in-memory compilation cache."""
    b = hi - lo
    B = bucket(b)
    T = bucket(max(len(r) for r in rows), 8)
    N = bucket(max_new, 8)
    prompt = np.zeros((B, T), np.int32)
    lengths = np.ones(B, np.int32)  # filler rows: one token, never decoded (done at start)
    for i, r in enumerate(rows):
        prompt[i, : len(r)] = r
        lengths[i] = len(r)
    batch = DecodeBatch(
        prompt=jnp.asarray(prompt),
        lengths=jnp.asarray(lengths),
        sampling=jax.tree.map(lambda a: a[lo:hi], params).pad(B),
        keys=jnp.pad(keys[lo:hi], ((0, B - b), (0, 0))),
        stop_ids=stop_arr,
        max_new=jnp.int32(max_new),
        num_live=jnp.int32(b),
    )
    if draft is None:
        fn, call_args, kw = _decode, (model.module, model.params, batch, N), {}
    else:
        sync = jnp.full((B,), mode == "sync")
        fn = speculative_decode
        call_args = (model.module, draft.module, model.params, draft.params, batch, sync)
        kw = {"spec": spec, "buffer": N}
    t0 = time.perf_counter()
    with traces() as traced:
        fn.lower(*call_args, **kw).compile()
    lowering_s = time.perf_counter() - t0
    result = fn(*call_args, **kw)
    out, counters = (result, None) if draft is None else result
    return np.asarray(out)[:b, :max_new], counters, lowering_s, bool(traced)


@flax.struct.dataclass(kw_only=True)
class DecodeState:
    """The plain decoder's `lax.while_loop` carry (B rows, `buffer` new-token columns).

    Fields:
      step: `[]` int32, the column the next token goes to (the prefill wrote column 0).
      last: `[B]` int32, each row's latest token (-1 once the row is done).
      out: `[B, buffer]` int32, new tokens so far, -1 padded.
      done: `[B]` bool, the row hit a stop token or max_new (or is a filler row).
      cache: the target's `KVCache` `[L, B, T + buffer, Hkv, D]`.
      counts: the `TokenCounts` of the prompt and the tokens so far (the penalties').
    """

    step: jax.Array
    last: jax.Array
    out: jax.Array
    done: jax.Array
    cache: KVCache
    counts: TokenCounts


@trace_cache.jit(static_argnames=("module", "buffer"))
def _decode(
    module: Llama,
    params: Any,
    batch: DecodeBatch,
    buffer: int,
) -> jax.Array:
    """Prefill, then a while loop of single-token steps; returns `[B, buffer]` (-1 padded)."""
    prompt_BT, lengths_B, keys_B2 = batch.prompt, batch.lengths, batch.keys
    sampling, stop_ids, max_new = batch.sampling, batch.stop_ids, batch.max_new
    B, T = prompt_BT.shape
    cache = init_cache(module.config, B, T + buffer, module.dtype)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    valid = positions < lengths_B[:, None]
    logits, cache = module.apply({"params": params}, prompt_BT, positions, valid, cache)
    last = jnp.take_along_axis(logits, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    counts = TokenCounts.of(prompt_BT, lengths_B, lengths_B, module.config.vocab_size)
    tok = sample_at(last, sampling, keys_B2, lengths_B, Purpose.TARGET, counts)
    out = jnp.full((B, buffer), -1, jnp.int32).at[:, 0].set(tok)
    filler = jnp.arange(B) >= batch.num_live
    done = jnp.isin(tok, stop_ids) | (max_new <= 1) | filler

    def cond(s: DecodeState) -> jax.Array:
        return (s.step < max_new) & ~jnp.all(s.done)

    def body(s: DecodeState) -> DecodeState:
        pos = lengths_B + s.step - 1  # where the previous token sits
        logits, cache = module.apply(
            {"params": params},
            jnp.maximum(s.last, 0)[:, None],
            pos[:, None],
            ~s.done[:, None],
            s.cache,
        )
        counts = s.counts.add(s.last[:, None])  # -1 (done rows) adds nothing
        new = sample_at(logits[:, 0], sampling, keys_B2, pos + 1, Purpose.TARGET, counts)
        new = jnp.where(s.done, -1, new)
        done = s.done | jnp.isin(new, stop_ids) | (s.step + 1 >= max_new)
        return DecodeState(
            step=s.step + 1, last=new, out=s.out.at[:, s.step].set(new), done=done, cache=cache,
            counts=counts,
        )  # fmt: skip

    state = DecodeState(step=jnp.int32(1), last=tok, out=out, done=done, cache=cache, counts=counts)
    return jax.lax.while_loop(cond, body, state).out
