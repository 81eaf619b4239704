"""Multi-tenant capacity: how many concurrent clients one server sustains at a fixed
per-client token rate, for cloud autoregressive decoding, co-located speculative decoding and
edge-cloud speculative decoding with the drafts offloaded to the clients (paper B).

For N clients at once (one batch of N rows), each mode's per-client rate is the tokens each
client receives per second of *server* time:
- cloud AR: `jaxspec.generate(target, N prompts)`; wall time is server time;
- co-located SD: `jaxspec.generate(target, N prompts, draft=draft)`; the server drafts too;
- edge-cloud SD: N sessions on a `verify.Scheduler`, driven in lock-step rounds by N edge
  drafters (one batched `edge.Drafter`, N rows). Only `Scheduler.tick()` — prefill, batch
  building, the verify step, commits — is server time; drafting runs on the clients' devices.
  (The network is left out: pipelined clients hide it, see the RTT sweep.)
The capacity of a mode is the largest N whose per-client rate still meets the target rate,
interpolated linearly between the measured N that bracket it. The paper predicts
capacity(edge-cloud) / capacity(co-located) = 1 + gamma * t_d / t_v; t_d (draft time per
token) and t_v (server time per verify round) are measured in the same lock-step runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import jaxspec
from edge.drafter import Drafter
from jaxspec import analytic
from jaxspec.protocol import DraftBlock, DraftSpec, SessionConfig
from jaxspec.sampling import SamplingParams, session_keys
from jaxspec_apps.bench.common import best_time

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
            temperature=0.0, stop_tokens=(), seed=i,
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
        "alpha": sum(s.accepted for s in sessions) / max(1, sum(s.drafted for s in sessions)),
    }
    for s in sids:
        sched.close(s)
    return out


def capacity_at(ns: Sequence[int], rates: Sequence[float], rate: float) -> dict[str, Any]:
    """The largest N whose per-client rate >= `rate`, linear between the bracketing measured
    N. `censored` is True when even the largest N sustains `rate` (a lower bound); below the
    smallest N the server's throughput / rate is taken (a fraction of a client)."""
    if rates[0] < rate:
        return {"clients": ns[0] * rates[0] / rate, "censored": False}
    for j in range(1, len(ns)):
        (n0, r0), (n1, r1) = (ns[j - 1], rates[j - 1]), (ns[j], rates[j])
        if r1 < rate:
            return {"clients": n0 + (n1 - n0) * (r0 - rate) / (r0 - r1), "censored": False}
    return {"clients": float(ns[-1]), "censored": True}


def run(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    sched: Any,
    *,
    ns: Sequence[int],
    gamma: int,
    new_tokens: int,
    client_rate: float,
    repeats: int,
) -> dict[str, Any]:
    """Per-client rates of every mode at every N, the capacities at `client_rate`, and the
    measured vs predicted capacity factor. `sched` needs a row bucket per N and
    `max_len >= prompt + new_tokens + 2 * gamma + 2`."""

    drafter = Drafter(draft, DraftSpec(gamma=gamma, encoding="onehot"))
    points = []
    for n in ns:
        ps = [list(p) for p in prompts[:n]]
        if len(ps) < n:
            raise ValueError(f"capacity at N={n} needs {n} prompts, got {len(prompts)}")
        rate = {}
        for mode, kw in (("cloud_ar", {}), ("colocated", {"draft": draft, "gamma": gamma})):
            t, out = best_time(
                lambda kw=kw, ps=ps: jaxspec.generate(
                    target, ps, new_tokens, temperature=0.0, stop_tokens=(), **kw
                ),
                repeats,
            )
            rate[mode] = out.stats.new_tokens / n / t
        lockstep(sched, drafter, ps, new_tokens=new_tokens)  # warm-up
        runs = [lockstep(sched, drafter, ps, new_tokens=new_tokens) for _ in range(repeats)]
        edge = min(runs, key=lambda r: r["server_s"])  # the least disturbed run
        rate["edge_cloud"] = edge["tokens"] / n / edge["server_s"]
        points.append({"clients": n, "per_client_tok_s": rate, "edge": edge})
    cap = {
        m: capacity_at(ns, [p["per_client_tok_s"][m] for p in points], client_rate) for m in MODES
    }
    one = points[0]["edge"]
    # The paper's t_d and t_v at the co-located capacity point (the largest measured N <= it).
    sat = max(
        (p for p in points if p["clients"] <= max(1.0, cap["colocated"]["clients"])),
        key=lambda p: p["clients"],
    )
    return {
        "gamma": gamma,
        "new_tokens": new_tokens,
        "client_rate": client_rate,
        "points": points,
        "capacity": cap,
        "capacity_factor_measured": cap["edge_cloud"]["clients"] / cap["colocated"]["clients"],
        "edge_over_cloud_ar": cap["edge_cloud"]["clients"] / cap["cloud_ar"]["clients"],
        "t_d": one["t_d"],
        "t_v": one["t_v"],
        "capacity_factor_predicted": analytic.capacity_factor(gamma, one["t_d"], one["t_v"]),
        "saturation_clients": sat["clients"],
        "capacity_factor_predicted_at_saturation": analytic.capacity_factor(
            gamma, sat["edge"]["t_d"], sat["edge"]["t_v"]
        ),
    }
