"""Multi-tenant capacity: how many concurrent clients one server sustains at a stated
per-client token rate, for cloud autoregressive decoding, co-located speculative decoding and
edge-cloud speculative decoding with the drafts offloaded to the clients (paper B).

For N clients at once (one batch of exactly N rows, no padding), each mode's per-client rate is
the tokens each client receives per second of *server* time:
- cloud AR: `jaxspec.generate(target, N prompts)`; wall time is server time;
- co-located SD: `jaxspec.generate(target, N prompts, draft=draft)`; the server drafts too;
- edge-cloud SD: N sessions on a `verify.Scheduler` of N slots, driven in lock-step rounds by
  N edge drafters (one batched `edge.Drafter`, N rows, in this process). Only
  `Scheduler.tick()` (prefill, batch building, the verify step, commits) counts as server time:
  the drafting runs here too, on the same 2 cores, but between ticks, so its time is the
  clients' own (as if each client drafted on its device). The network is left out: pipelined
  clients hide it (see the RTT sweep).
A mode's capacity is found by bisection (`bisect_capacity`): N doubles until the rate falls
below the target, then integer bisection narrows the bracket, and the capacity is interpolated
linearly between its ends. The paper predicts capacity(edge-cloud) / capacity(co-located) =
1 + gamma * t_d / t_v, with t_d (the server's batched draft time per drafted position) and t_v
(the verify round's server time) measured in a lock-step run at N = the co-located capacity.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import jaxspec
from edge.drafter import Drafter
from jaxspec.compilation.shapes import bucket
from jaxspec.decoding import analytic
from jaxspec.decoding.sampling import SamplingParams, session_keys
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from jaxspec_apps.bench.common import best_time, make_scheduler, prompts_from
from jaxspec_apps.bench.section import Context, Section, sizes

# This section's sizes (bisection on the number of clients (`bisect_capacity`); `client_rate`:
# tokens/s every client must get): start: the first N tried; N doubles (halves) from there;
# max_clients: at most this many (a capacity above it is censored); precision: bisection stops at a
# bracket within 12.5% of N.
Config = sizes(
    "capacity_",
    start=4,
    max_clients=128,
    precision=0.125,
    new_tokens=64,
    client_rate=100.0,
    flags={"client_rate": "client_rate"},
)


QUICK_SIZES = Config(start=8, max_clients=32, precision=0.5, new_tokens=12)
# one probe per mode: bisect_capacity is unit-tested; the machinery runs
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=8, start=1, max_clients=1)
REAL_SIZES = Config(max_clients=64, precision=0.25, new_tokens=32, client_rate=10.0)

MODES = ("cloud_ar", "colocated", "edge_cloud")


def lockstep(
    sched: Any, drafter: Drafter, prompts: Sequence[Sequence[int]], *, new_tokens: int
) -> dict[str, float]:
    """N greedy edge clients (sessions of `drafter.spec`) against `sched`, every round: all
    unfinished clients draft a block, submit it, one `tick()` verifies them together, each
    drafter rolls back to what was accepted and appends the correction or bonus. Returns
    token, time and round counts."""

    n = len(prompts)
    sids = []
    for i, p in enumerate(prompts):
        cfg = SessionConfig(
            prompt=tuple(int(t) for t in p), max_new_tokens=new_tokens,
            sampling=SamplingSettings(temperature=0.0), stop_tokens=(), seed=i,
            draft=drafter.spec,
        )  # fmt: skip
        sids.append(sched.open(cfg).session_id)
    sessions = [sched.sessions[s] for s in sids]
    state = drafter.prefill(drafter.init(n, sched.config.max_len), prompts)
    sampling, keys = SamplingParams.make(n, 0.0), session_keys(list(range(n)), n)
    server = verify = drafting = 0.0
    rounds = 0
    t0 = time.perf_counter()
    while any(not s.ready_to_verify for s in sessions):
        sched.tick()
    server += time.perf_counter() - t0
    while live := [i for i, s in enumerate(sessions) if not s.finished]:
        t0 = time.perf_counter()
        alive = np.zeros(n, bool)
        alive[live] = True
        state, blk = drafter.draft(state, sampling, keys, alive)
        toks, starts = np.asarray(blk.tokens), np.asarray(blk.start)
        drafting += time.perf_counter() - t0
        t0 = time.perf_counter()
        row = {}
        for i in live:
            s = sessions[i]
            block = DraftBlock(
                session_id=s.id, epoch=s.epoch, start=int(starts[i]),
                tokens=tuple(int(t) for t in toks[i]),
            )  # fmt: skip
            row[sched.submit(block)] = i
        results = sched.tick()
        dt = time.perf_counter() - t0
        server, verify, rounds = server + dt, verify + dt, rounds + 1
        # Every row at once (fixed shapes, one compilation): rows without a verdict token
        # roll back to "no lower than now" and append nothing.
        keep = np.full(n, np.iinfo(np.int32).max, np.int32)
        nxt, count = np.zeros((n, 1), np.int32), np.zeros(n, np.int32)
        for ticket, r in results:
            if r.next_token is not None and not r.stale:
                i = row[ticket]
                keep[i], nxt[i, 0], count[i] = r.start + r.accepted, r.next_token, 1
        state = drafter.append(
            drafter.rollback(state, np.arange(n), keep), np.arange(n), nxt, count
        )
    out = {
        "clients": n,
        "tokens": sum(s.new_tokens for s in sessions),
        "server_s": server,
        "rounds": rounds,
        "t_v": verify / rounds,  # server time of one verify round (all N rows)
        "t_d": drafting / (rounds * drafter.spec.gamma),  # per drafted token, N drafters
        "alpha": sum((s.figures for s in sessions), AcceptanceFigures()).acceptance_rate,
    }
    for s in sids:
        sched.close(s)
    return out


def capacity_at(ns: Sequence[int], rates: Sequence[float], rate: float) -> dict[str, Any]:
    """The largest N whose per-client rate >= `rate`, linear between the bracketing measured
    N (sorted). `censored` is True when even the largest N sustains `rate` (a lower bound);
    below the smallest N the server's throughput / rate is taken (a fraction of a client)."""
    if rates[0] < rate:
        return {"clients": ns[0] * rates[0] / rate, "censored": False}
    for j in range(1, len(ns)):
        (n0, r0), (n1, r1) = (ns[j - 1], rates[j - 1]), (ns[j], rates[j])
        if r1 < rate:
            return {"clients": n0 + (n1 - n0) * (r0 - rate) / (r0 - r1), "censored": False}
    return {"clients": float(ns[-1]), "censored": True}


def bisect_capacity(
    rate_at: Callable[[int], float],
    rate: float,
    *,
    start: int = 4,
    max_clients: int = 128,
    precision: float = 0.125,
) -> dict[str, Any]:
    """The capacity at per-client `rate` of a server whose per-client rate at N clients is
    `rate_at(N)` (measured; each N once): from `start`, N doubles (or halves) until the rate
    crosses `rate` or N reaches `max_clients` (censored), then integer bisection until the
    bracket is within `precision` of N, then `capacity_at` over every probe. Returns
    clients, censored, bracket and the probes `[(N, rate)]` in the order taken."""
    seen: dict[int, float] = {}

    def at(n: int) -> float:
        if n not in seen:
            seen[n] = rate_at(n)
        return seen[n]

    lo = hi = max(1, min(start, max_clients))
    if at(lo) >= rate:  # grow: hi is the first N that fails (or max_clients: censored)
        while at(hi) >= rate and hi < max_clients:
            lo, hi = hi, min(2 * hi, max_clients)
        if at(hi) >= rate:
            lo = hi
    else:  # shrink: lo is the first N that sustains the rate (or 1: a fraction of a client)
        while lo > 1 and at(lo) < rate:
            lo, hi = lo // 2, lo
        if at(lo) < rate:
            hi = lo
    while at(hi) < rate and hi - lo > max(1, precision * lo):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) >= rate else (lo, mid)
    ns = sorted(seen)
    out = capacity_at(ns, [seen[k] for k in ns], rate)
    return out | {"bracket": [lo, hi], "probes": [[k, r] for k, r in seen.items()]}


def run(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    c: Any,
    *,
    gamma: int,
    repeats: int,
) -> dict[str, Any]:
    """Each mode's capacity at `c.client_rate` by bisection (module doc) at the sizes `c` (a
    `Config`), every probe's measurements, and the measured vs predicted capacity factor.
    Client i sends `prompts[i % len(prompts)]`."""
    new_tokens, client_rate = c.new_tokens, c.client_rate
    start, max_clients, precision = c.start, c.max_clients, c.precision
    longest = max(len(p) for p in prompts)
    max_len = bucket(longest + new_tokens + 2 * gamma + 2, 64)
    drafter = Drafter(draft, DraftSpec(gamma=gamma, encoding="onehot"))
    edge_runs: dict[int, dict[str, float]] = {}

    def clients(n: int) -> list[list[int]]:
        return [list(prompts[i % len(prompts)]) for i in range(n)]

    def generate_rate(n: int, **kw: Any) -> float:
        ps = clients(n)
        t, out = best_time(
            lambda: jaxspec.generate(target, ps, new_tokens, temperature=0.0, stop_tokens=(), **kw),
            repeats,
        )
        return out.stats.new_tokens / n / t

    def edge_rate(n: int) -> float:
        sched = make_scheduler(target, rows=(n,), gamma=gamma, max_len=max_len, warm=False)
        ps = clients(n)
        lockstep(sched, drafter, ps, new_tokens=new_tokens)  # warm-up: compiles
        runs = [lockstep(sched, drafter, ps, new_tokens=new_tokens) for _ in range(repeats)]
        edge_runs[n] = min(runs, key=lambda r: r["server_s"])  # the least disturbed run
        return edge_runs[n]["tokens"] / n / edge_runs[n]["server_s"]

    rate_at = {
        "cloud_ar": generate_rate,
        "colocated": lambda n: generate_rate(n, draft=draft, gamma=gamma),
        "edge_cloud": edge_rate,
    }
    kw = dict(start=start, max_clients=max_clients, precision=precision)
    cap = {m: bisect_capacity(rate_at[m], client_rate, **kw) for m in MODES}
    # t_d, t_v where co-located SD saturates (the paper's operating point), and at N = 1.
    sat = max(1, min(max_clients, round(cap["colocated"]["clients"])))
    if sat not in edge_runs:
        edge_rate(sat)
    if 1 not in edge_runs:
        edge_rate(1)
    at_sat, one = edge_runs[sat], edge_runs[1]
    predicted = analytic.capacity_factor(gamma, at_sat["t_d"], at_sat["t_v"])
    # What the model leaves out: a round's server time grows less than its clients (the
    # verify step reads the weights once for every row). Per client, at N = 1 and at the
    # lock-step run nearest the edge-cloud capacity.
    near = min(edge_runs, key=lambda k: abs(k - cap["edge_cloud"]["clients"]))
    per_client = {str(k): edge_runs[k]["t_v"] / k for k in sorted({1, near})}
    return {
        "gamma": gamma,
        "new_tokens": new_tokens,
        "client_rate": client_rate,
        "method": {"start": start, "max_clients": max_clients, "precision": precision},
        "capacity": cap,
        "edge": {str(n): r for n, r in sorted(edge_runs.items())},
        "capacity_factor_measured": cap["edge_cloud"]["clients"] / cap["colocated"]["clients"],
        "edge_over_cloud_ar": cap["edge_cloud"]["clients"] / cap["cloud_ar"]["clients"],
        "saturation_clients": sat,
        "t_d": at_sat["t_d"],
        "t_v": at_sat["t_v"],
        "capacity_factor_predicted": predicted,
        "capacity_factor_predicted_batch1": analytic.capacity_factor(gamma, one["t_d"], one["t_v"]),
        "measured_over_predicted": cap["edge_cloud"]["clients"]
        / cap["colocated"]["clients"]
        / predicted,
        "verify_per_client_s": per_client,
        "verify_batching_gain": per_client["1"] / per_client[str(near)],
    }


def run_tiny(ctx: Context) -> dict[str, Any]:
    """The tiny pair's clients send held-out windows (up to 64 different ones)."""
    p = ctx.p
    prompts = prompts_from(ctx.stream, min(p.capacity.max_clients, 64), p.prompt_len, seed=1)
    return run(ctx.target, ctx.draft, prompts, p.capacity, gamma=p.gamma, repeats=p.repeats)


def run_real(ctx: Context) -> dict[str, Any]:
    """The real pair's clients send the Spec-Bench prompts."""
    p = ctx.p
    return run(ctx.target, ctx.draft, ctx.pool, p.capacity, gamma=p.gamma, repeats=p.repeats)


TINY = Section("capacity", run_tiny)
REAL = Section("capacity", run_real)
