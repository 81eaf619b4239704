"""The `capacity` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, prose, ratio, save


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
        *part(
            "## 3. Multi-tenant capacity",
            prose("capacity", **c),
            table_md(c),
        ),
        *feasible_md(c, page.sections.get("latency")),
        *page.img("capacity", "capacity"),
    ]


def markdown_real(c: dict[str, Any], page: Page) -> list[str]:
    """The real pair's capacity tables."""
    return part("### Capacity", table_md(c))


def has_plot(c: dict[str, Any]) -> bool:
    """Whether `plot` draws one: not for results from before the bisection."""
    return "method" in c


def plot(c: dict[str, Any], bench: Any) -> dict[str, str]:
    """Per-client rate against N for each mode, with the capacities found (none for a
    report from before the bisection)."""
    if not has_plot(c):
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
