"""Each jitted program of a mode against the forwards it is made of (`program_vs_parts`).

A mode's time is spent inside a few jitted programs. Each is timed here beside the sum of
its parts' forwards, every forward timed alone at the program's shapes (rows x positions,
the cache's rows and length, the KV bucket it attends over), in the same process and run,
all in turns (one call of each per turn, the best of the turns kept):

    plain decode token   the target's decode loop (`jaxspec.generate`), per token:
                         (t(n) - t(n0)) / (n - n0); part: one target forward [1, 1]
    co-located round     `speculative_decode`'s loop (full q, `generate`'s default), per
                         round: (t(n) - t(n0)) / (its rounds(n) - rounds(n0)), one compiled
                         loop (only max_new differs);
                         parts: gamma draft forwards, the first [1, 2] in the share f of
                         rounds that also feed the previous token (after a bonus), [1, 1]
                         otherwise, + one target forward [1, gamma + 1]
    drafter round        `edge.drafter` `Drafter.round` (rollback, append, gamma drafts),
                         the edge's onehot block; parts: gamma draft forwards [1, 1]
    verify step R        the verifier's step (`Scheduler` tick, its `last_step_s`) with R
                         sessions of gamma onehot drafts; part: one target forward [R,
                         gamma + 1] over the verifier's KV pool (slots, KV bucket)
    gamma-0 step         the same with one session of gamma 0 (an empty block); part: one
                         target forward [1, 1] over the pool

The ratio measured / parts is the program's work that is not a forward (sampling, q, the
rule, copies, dispatch, the result's transfer); a forward's own cost against its roofline
is the kernels' (the `cost` and `kernels` sections). Host time beside a step (the
scheduler's Python and the batch it builds) is the `host` column.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from edge.drafter import Drafter
from jaxspec.compilation.shapes import bucket
from jaxspec.decoding.sampling import SamplingParams, session_key, session_keys
from jaxspec.decoding.speculative import DecodeBatch, speculative_decode
from jaxspec.nn.model import init_cache
from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from jaxspec.quant.calibration import prompt_ids
from verify import Scheduler, SchedulerConfig


@functools.partial(jax.jit, static_argnames=("module", "kv_len"), donate_argnums=(2,))
def _forward(module, params, cache, tokens_RT, positions_RT, valid_RT, slots_R, kv_len=None):
    """One forward, as the programs run it (the cache donated: written in place)."""
    logits, cache = module.apply(
        {"params": params}, tokens_RT, positions_RT, valid_RT, cache, slots_R, kv_len
    )
    return logits, cache


def forward_part(
    model: Any, rows: int, width: int, cache_rows: int, cache_len: int, kv_len: int | None = None,
    slots: bool = False, at: int = 0,
) -> Callable[[], None]:  # fmt: skip
    """A callable that runs one forward of `rows` x `width` positions (from position `at`)
    over a cache of `cache_rows` x `cache_len` (the verifier's pool: `slots`, attending over
    `kv_len` positions) and waits for its logits."""
    box = [init_cache(model.config, cache_rows, cache_len, model.dtype)]
    tok = jnp.ones((rows, width), jnp.int32)
    pos = jnp.broadcast_to(at + jnp.arange(width, dtype=jnp.int32), (rows, width))
    valid = jnp.ones((rows, width), bool)
    sl = jnp.arange(rows, dtype=jnp.int32) if slots else None

    def run() -> None:
        logits, box[0] = _forward(model.module, model.params, box[0], tok, pos, valid, sl, kv_len)
        logits.block_until_ready()

    return run


def in_turns(calls: dict[str, Callable[[], Any]], turns: int) -> dict[str, float]:
    """Best seconds of each call over `turns` turns (every call once per turn, after two
    warm-up calls each: compiled, caches touched)."""
    for f in calls.values():
        f()
        f()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(turns):
        for name, f in calls.items():
            t0 = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def colocated_call(
    target: Any, draft: Any, prompt: list[int], gamma: int, n: int, max_new: int | None = None,
    text: bool = True,
) -> tuple[Callable[[], Any], str]:  # fmt: skip
    """The co-located loop as `jaxspec.generate` runs it (T = 0, full q, one row, a buffer of
    `n` new tokens, `max_new` of them made): a call that waits for it, and (`text`) its
    compiled program's text."""
    T, N = bucket(len(prompt), 8), bucket(n, 8)
    p = np.zeros((1, T), np.int32)
    p[0, : len(prompt)] = prompt
    spec = DraftSpec(gamma=gamma, encoding="full")
    batch = DecodeBatch(
        prompt=jnp.asarray(p), lengths=jnp.asarray([len(prompt)], jnp.int32),
        sampling=SamplingParams.of([SamplingSettings(temperature=0.0)]).pad(1),
        keys=session_keys(0, 1), stop_ids=jnp.asarray([-1], jnp.int32),
        max_new=jnp.int32(n if max_new is None else max_new), num_live=jnp.int32(1),
    )  # fmt: skip
    args = (target.module, draft.module, target.params, draft.params, batch, jnp.ones(1, bool))
    lowered = speculative_decode.lower(*args, spec=spec, buffer=N) if text else None
    compiled = lowered.compile().as_text() if lowered is not None else ""
    return lambda: jax.block_until_ready(speculative_decode(*args, spec=spec, buffer=N)), compiled


def _colocated(target: Any, draft: Any, prompt: list[int], gamma: int, n: int, n0: int) -> dict:
    """The co-located loop at n and n0 new tokens (one compiled loop), T = 0, full q (as
    `jaxspec.generate` drafts by default): its calls and the rounds each made, the share of
    rounds that fed the previous token first."""

    def call(max_new: int):
        return colocated_call(target, draft, prompt, gamma, n, max_new, text=False)[0]

    figures = {m: call(m)()[1].to_figures() for m in (n, n0)}
    rounds = figures[n].rounds - figures[n0].rounds
    bonus = figures[n].accepted_per_position[-1] - figures[n0].accepted_per_position[-1]
    return {
        "calls": {"long": call(n), "short": call(n0)},
        "rounds": rounds,
        "feed_prev": bonus / rounds,
        "cache_len": bucket(len(prompt), 8) + bucket(n, 8) + gamma + 1,
    }


def _verifier(target: Any, prompt: list[int], gamma: int, rows: tuple[int, ...]) -> Any:
    """A scheduler and `step(R)`: R sessions of gamma onehot drafts (R = 0: one session of
    gamma 0) submit one block each, then one tick. Sessions are reopened (untimed: the call
    after is) when their blocks would leave the shortest KV bucket, which every step reads."""
    config = SchedulerConfig(max_sessions=max(rows), max_len=bucket(len(prompt) + 256, 64),
                             max_gamma=gamma, row_buckets=rows)  # fmt: skip
    sched, live = Scheduler(target, config), []
    A = config.kv_buckets[0]

    def reopen(g: int, count: int) -> None:
        for s in live:
            sched.close(s.id)
        live.clear()
        room = config.max_len - len(prompt) - gamma - 1
        cfg = SessionConfig(prompt=tuple(prompt), max_new_tokens=room,
                            sampling=SamplingSettings(temperature=0.0),
                            draft=DraftSpec(gamma=g, encoding="onehot"))  # fmt: skip
        live.extend(sched.sessions[sched.open(cfg).session_id] for _ in range(count))
        while not all(s.ready_to_verify for s in live):
            sched.tick()

    def step(R: int) -> tuple[float, float]:
        """(the tick's seconds, the step's own: `last_step_s`)."""
        g, count = (gamma, R) if R else (0, 1)
        stale = [s for s in live if s.config.draft.gamma != g or s.committed + g + 1 > A]
        if len(live) != count or stale:
            reopen(g, count)
        for i, s in enumerate(live):
            drafts = tuple((7 * i + j) % target.config.vocab_size for j in range(g))
            sched.submit(DraftBlock(session_id=s.id, epoch=s.epoch, start=s.committed,
                                    tokens=drafts))  # fmt: skip
        t0 = time.perf_counter()
        sched.tick()
        return time.perf_counter() - t0, sched.metrics.last_step_s

    return sched, step


def measure(ctx: Any, turns: int, rows: tuple[int, ...]) -> dict[str, Any]:
    """The program_vs_parts rows of the pair's modes (module doc), T = 0, gamma as profiled."""
    target, draft, g = ctx.target, ctx.draft, ctx.p.gamma
    prompt = list(prompt_ids(target, ctx.p.two_process.chat))
    n = ctx.p.round_profile.new_tokens
    n0 = max(2, n // 8)
    co = _colocated(target, draft, prompt, g, n, n0)

    def plain(k: int) -> Callable[[], Any]:
        return lambda: jaxspec.generate(target, prompt, k, temperature=0.0, stop_tokens=())

    d = Drafter(draft, DraftSpec(gamma=g, encoding="onehot"))
    d_len = bucket(len(prompt) + n + 3 * g + 2, 64)
    state = [d.prefill(d.init(1, d_len), [prompt]), len(prompt)]
    sp, key = SamplingParams.of([SamplingSettings(temperature=0.0)]), session_key(0, 0)[None]

    def drafter_round() -> None:  # keep the appended token, drop the drafts: KV lags by one
        keep = state[1] if state[1] + 2 * g + 2 < d_len else len(prompt)
        state[0], batch = d.round(state[0], [keep], [[5]], [1], sp, key)
        batch.tokens.block_until_ready()
        state[1] = keep + 1

    sched, step = _verifier(target, prompt, g, rows)
    steps: dict[str, list[tuple[float, float]]] = {}

    def timed(name: str, R: int) -> Callable[[], None]:  # records its tick's own times
        return lambda: steps.setdefault(name, []).append(step(R))

    pool = dict(cache_rows=sched.config.max_sessions, cache_len=sched.config.max_len,
                kv_len=sched.config.kv_buckets[0], slots=True, at=len(prompt) + 8)  # fmt: skip
    at = len(prompt) + 8
    calls: dict[str, Callable[[], Any]] = {
        "plain long": plain(n),
        "plain short": plain(n0),
        "co-located long": co["calls"]["long"],
        "co-located short": co["calls"]["short"],
        "drafter round": drafter_round,
        "gamma-0 step": timed("gamma-0 step", 0),
        **{f"verify step {R}": timed(f"verify step {R}", R) for R in rows},
        "part target 1x1": forward_part(
            target, 1, 1, 1, bucket(len(prompt), 8) + bucket(n, 8), at=at
        ),
        "part target 1x(g+1)": forward_part(target, 1, g + 1, 1, co["cache_len"], at=at),
        "part draft 1x1": forward_part(draft, 1, 1, 1, co["cache_len"], at=at),
        "part draft 1x2": forward_part(draft, 1, 2, 1, co["cache_len"], at=at),
        "part draft 1x1 (edge)": forward_part(draft, 1, 1, 1, d_len, at=at),
        "part pool 1x1": forward_part(target, 1, 1, **pool),
        **{f"part pool {R}x(g+1)": forward_part(target, R, g + 1, **pool) for R in rows},
    }
    best = in_turns(calls, turns)
    return _rows(best, steps, co, n, n0, g, rows)


def _rows(best, steps, co, n, n0, g, rows) -> dict[str, Any]:
    """The table's rows from the best times (seconds): program, parts, their ratio, and
    beside a verifier step the host time of its tick."""
    f = co["feed_prev"]

    def row(program: str, measured: float, parts: float, what: str, host: float | None = None):
        return {"program": program, "measured_s": measured, "parts_s": parts, "parts": what,
                "ratio": measured / parts, "host_s": host}  # fmt: skip

    def step_row(name: str, program: str, part: str, what: str):
        tick, own = min(steps[name], key=lambda x: x[1])
        return row(program, own, best[part], what, tick - own)

    out = [
        row("plain decode token", (best["plain long"] - best["plain short"]) / (n - n0),
            best["part target 1x1"], "target [1, 1]"),
        row("co-located round", (best["co-located long"] - best["co-located short"])
            / co["rounds"], (g - f) * best["part draft 1x1"] + f * best["part draft 1x2"]
            + best["part target 1x(g+1)"],
            f"{g - f:.2f} x draft [1, 1] + {f:.2f} x draft [1, 2] + target [1, {g + 1}]"),
        row("drafter round", best["drafter round"], g * best["part draft 1x1 (edge)"],
            f"{g} x draft [1, 1]"),
        step_row("gamma-0 step", "gamma-0 step", "part pool 1x1", "target [1, 1] (pool)"),
        *(step_row(f"verify step {R}", f"verify step {R}x{g + 1}", f"part pool {R}x(g+1)",
                   f"target [{R}, {g + 1}] (pool)") for R in rows),
    ]  # fmt: skip
    return {"rows": out, "feed_prev_share": f, "colocated_rounds": co["rounds"]}
