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
from jaxspec_apps.bench.report_tables import ratio, save
from jaxspec_apps.bench.section import Context, Page, Section

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


def sizes(p: Any) -> dict[str, Any]:
    """`run`'s keyword arguments from a bench `Profile`."""
    return dict(
        gamma=p.gamma, new_tokens=p.capacity_new_tokens, client_rate=p.client_rate,
        repeats=p.repeats, start=p.capacity_start, max_clients=p.capacity_max_clients,
        precision=p.capacity_precision,
    )  # fmt: skip


def run(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    *,
    gamma: int,
    new_tokens: int,
    client_rate: float,
    repeats: int,
    start: int = 4,
    max_clients: int = 128,
    precision: float = 0.125,
) -> dict[str, Any]:
    """Each mode's capacity at `client_rate` by bisection (module doc), every probe's
    measurements, and the measured vs predicted capacity factor. Client i sends
    `prompts[i % len(prompts)]`."""
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
    prompts = prompts_from(ctx.stream, min(p.capacity_max_clients, 64), p.prompt_len, seed=1)
    return run(ctx.target, ctx.draft, prompts, **sizes(p))


def run_real(ctx: Context) -> dict[str, Any]:
    """The real pair's clients send the Spec-Bench prompts."""
    return run(ctx.target, ctx.draft, ctx.pool, **sizes(ctx.p))


def table_md(c: dict[str, Any]) -> list[str]:
    """The method, each mode's capacity with its probes, the lock-step runs and the
    measured vs predicted factor."""
    if "method" not in c:  # a report from before the bisection: its capped sweep
        return _capacity_sweep_md(c)
    cap, names = c["capacity"], {"cloud_ar": "cloud AR", "colocated": "co-located SD",
                                 "edge_cloud": "edge-cloud SD"}  # fmt: skip

    def n(m: str) -> str:
        return ("≥ " if cap[m]["censored"] else "") + f"{cap[m]['clients']:.1f}"

    meth = c["method"]
    lines = [
        f"Method: each mode's capacity at {c['client_rate']:g} tokens/s per client is found by "
        f"bisection on N, the number of clients served at once in one batch of exactly N rows: "
        f"N doubles from {meth['start']} (at most {meth['max_clients']}) until the per-client "
        f"rate falls below the target, then integer bisection narrows the bracket to within "
        f"{meth['precision']:.0%} of N, and the capacity is interpolated linearly inside it. A "
        "client's rate is its tokens per second of *server* time. Cloud AR and co-located SD "
        "are `jaxspec.generate` over N prompts (the co-located server drafts too). Edge-cloud SD "
        "runs N sessions on a verifier of N slots, driven in lock-step rounds by one batched "
        "W4A16 drafter of N rows in the same process; only the verifier's `tick()` counts as "
        "server time, so the clients' drafting, which shares these 2 cores between ticks, is "
        "placed on their own devices (real processes per client would have 2 cores to share "
        "with the server here). The network is left out: pipelined clients hide it.",
        "",
        "| mode | clients sustained | bracket | probes: N → tokens/s per client |",
        "|---|---:|---|---|",
    ]
    for m, label in names.items():
        probes = ", ".join(f"{k} → {r:.1f}" for k, r in cap[m]["probes"])
        lo, hi = cap[m]["bracket"]
        lines.append(f"| {label} | {n(m)} | {lo}..{hi} | {probes} |")
    lines += [
        "",
        "| edge-cloud lock-step run at N | server ms per round (t_v) | "
        "drafting ms per position, all N (t_d) | α |",
        "|---:|---:|---:|---:|",
    ]
    for k, e in c["edge"].items():
        lines.append(f"| {k} | {e['t_v'] * 1e3:.2f} | {e['t_d'] * 1e3:.3f} | {e['alpha']:.3f} |")
    lines += [
        "",
        f"Clients sustained at {c['client_rate']:g} tokens/s each: cloud AR {n('cloud_ar')}, "
        f"co-located SD {n('colocated')}, edge-cloud SD {n('edge_cloud')}. "
        f"Edge-cloud ÷ co-located = **{ratio(c['capacity_factor_measured'])} measured** vs "
        f"**{ratio(c['capacity_factor_predicted'])} predicted** by 1 + γ·t_d/t_v with t_d = "
        f"{c['t_d'] * 1e3:.3f} ms, t_v = {c['t_v'] * 1e3:.2f} ms measured at N = "
        f"{c['saturation_clients']}, where co-located SD saturates "
        f"({ratio(c['capacity_factor_predicted_batch1'])} with the batch-1 times). "
        f"Edge-cloud ÷ cloud AR = **{ratio(c['edge_over_cloud_ar'])}**.",
        *_batching_md(c),
    ]
    return lines


def _batching_md(c: dict[str, Any]) -> list[str]:
    """The term the papers' factor leaves out, where this run measured it."""
    if "verify_per_client_s" not in c:  # a report from before it was measured
        return []
    per = c["verify_per_client_s"]
    at = ", ".join(f"{float(v) * 1e3:.1f} ms at N = {k}" for k, v in per.items())
    return [
        "",
        "The papers' factor holds when a round's server time grows in proportion to its "
        "clients; a verify round's grows less (one read of the weights serves every row): "
        f"its server time per client is {at}, a factor "
        f"{ratio(c['verify_batching_gain'])} that 1 + γ·t_d/t_v leaves out (edge-cloud SD runs "
        "at its many clients' N, co-located SD saturates near N = "
        f"{c['saturation_clients']}).",
    ]


def _capacity_sweep_md(c: dict[str, Any]) -> list[str]:
    """The capacity section of results written before the bisection (a fixed sweep of N)."""
    lines = [
        "| clients N | cloud AR tok/s per client | co-located SD | edge-cloud SD | edge α |",
        "|---:|---:|---:|---:|---:|",
    ]
    for pt in c["points"]:
        rate, e = pt["per_client_tok_s"], pt["edge"]
        lines.append(
            f"| {pt['clients']} | {rate['cloud_ar']:.0f} | {rate['colocated']:.0f} | "
            f"{rate['edge_cloud']:.0f} | {e['alpha']:.3f} |"
        )
    cap = c["capacity"]
    n = {m: ("≥ " if cap[m]["censored"] else "") + f"{cap[m]['clients']:.1f}" for m in cap}
    return [
        *lines,
        "",
        f"Clients sustained at {c['client_rate']:g} tokens/s each (a capped sweep, from an "
        f"earlier version of the section): cloud AR {n['cloud_ar']}, co-located SD "
        f"{n['colocated']}, edge-cloud SD {n['edge_cloud']}. Edge-cloud / co-located = "
        f"{ratio(c['capacity_factor_measured'])} measured vs "
        f"{ratio(c['capacity_factor_predicted'])} predicted.",
    ]


def feasible_md(c: dict[str, Any], lat: dict[str, Any] | None) -> list[str]:
    """Whether one edge client can itself reach the target rate over a WAN (RTT sweep)."""
    at50 = [r for r in (lat or {}).get("rows", []) if r["rtt_ms"] == 50]
    if not at50:
        return []
    rate = 1 / at50[0]["measured"]["pipelined"]
    verdict = "reaches" if rate >= c["client_rate"] else "does NOT reach"
    return [
        "",
        f"One pipelined edge client at 50 ms RTT gets {rate:.0f} tokens/s (section 4), so it "
        f"{verdict} the {c['client_rate']:g} tokens/s target on its own.",
    ]


def markdown_tiny(c: dict[str, Any], page: Page) -> list[str]:
    """Section 3 of the tiny pair's report."""
    return [
        "",
        "## 3. Multi-tenant capacity",
        "",
        f"N clients served at once, greedy, {c['new_tokens']} new tokens each, γ = "
        f"{c['gamma']}. Per-client rate = tokens a client gets per second of server time. "
        "Cloud AR and co-located SD: `jaxspec.generate` on a batch of N prompts (the server "
        "computes everything). Edge-cloud SD: N sessions on one `verify.Scheduler`, driven "
        "in lock-step by N edge drafters whose time is not server time (they run on the "
        "clients); every `tick()` — prefill, batching, the verify step, commits — is. The "
        "network is left out (pipelined clients hide it: section 4). Capacity = the largest "
        "N whose per-client rate meets the target, linear between measured N (≥ when even "
        "the largest N meets it).",
        "",
        *table_md(c),
        *feasible_md(c, page.sections.get("latency")),
        *page.img("capacity", "capacity"),
    ]


def markdown_real(c: dict[str, Any], page: Page) -> list[str]:
    """The real pair's capacity tables."""
    return ["", "### Capacity", "", *table_md(c)]


def plot(c: dict[str, Any], bench: Any) -> dict[str, str]:
    """Per-client rate against N for each mode, with the capacities found (none for a
    report from before the bisection)."""
    if "method" not in c:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m, color in zip(("cloud_ar", "colocated", "edge_cloud"), ("C0", "C1", "C2"), strict=True):
        probes = sorted(c["capacity"][m]["probes"])
        ax.plot([k for k, _ in probes], [r for _, r in probes], "o-", color=color, label=m)
        ax.axvline(c["capacity"][m]["clients"], color=color, ls=":", lw=1)
    ax.axhline(c["client_rate"], color="k", lw=0.8, label="target rate")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent clients N")
    ax.set_ylabel("tokens/s per client (server time)")
    ax.set_title(
        f"capacity: measured {ratio(c['capacity_factor_measured'])} vs predicted "
        f"{ratio(c['capacity_factor_predicted'])} (edge ÷ co-located)"
    )
    ax.legend()
    return save(fig, bench, "capacity")


TINY = Section("capacity", run_tiny, markdown_tiny, plot)
REAL = Section("capacity", run_real, markdown_real)
