"""Tables that both pairs' parts of BENCHMARKS.md print (`report`, `real_report`)."""

from __future__ import annotations

from typing import Any


def ratio(v: float) -> str:
    """`v` as a ratio: 1.23×."""
    return f"{v:.2f}×"


def headline_md(
    keys: list[tuple[str, str]], r: dict[str, Any], middle: list[str] = ()
) -> list[str]:
    """The headline table: one row per scalar key of `keys` that `r` holds, then the rows
    `middle` (a pair's own composite keys), then the wire bytes per encoding."""
    lines = ["| key | value | meaning |", "|---|---:|---|"]
    lines += [f"| `{k}` | {r[k]:.3f} | {meaning} |" for k, meaning in keys if k in r]
    lines += list(middle)
    if "wire_bytes_per_token" in r:
        wb = ", ".join(f"{k} {v:,.0f}" for k, v in r["wire_bytes_per_token"].items())
        lines.append(f"| `wire_bytes_per_token` | {wb} | per encoding, up + down |")
    return lines


def machine_line(r: dict[str, Any]) -> str:
    m = r["machine"]
    extra = ", ".join(f"{k} {m[k]}" for k in ("torch", "transformers") if k in m)
    return (
        f"{m['cores']} CPU cores ({m['processor']}), {m['memory_gib']} GiB memory, "
        f"jax {m['jax']} ({m['jax_backend']}), Python {m['python']}"
        + (f", {extra}" if extra else "")
        + f"; {m['platform']}; 1-minute load average {m['load_average_1min_start']:.1f} at the "
        f"start and {m['load_average_1min_end']:.1f} at the end (other work shared the cores)"
    )


def peer_md(pr: dict[str, Any]) -> list[str]:
    names = {
        "hf_plain": "transformers `generate` (plain greedy)",
        "hf_assisted": "transformers assisted generation (default dynamic draft length)",
        "hf_assisted_const": f"transformers assisted generation (constant {pr['gamma']} drafts)",
        "ours_plain": "jaxspec `generate` (plain greedy)",
        "ours_spec": f"jaxspec `generate(draft=…, gamma={pr['gamma']})` (sync)",
    }
    t = pr["tok_s"]
    lines = ["| decoder | tokens/s | vs transformers plain |", "|---|---:|---:|"]
    for k, label in names.items():
        lines.append(f"| {label} | {t[k]:.0f} | {ratio(t[k] / t['hf_plain'])} |")
    return lines


def capacity_md(c: dict[str, Any]) -> list[str]:
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
    ]
    return lines


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


def verifier_md(v: dict[str, Any]) -> list[str]:
    roof = v["roofline"]
    lines = [
        f"Machine roofline, measured in this run: read bandwidth "
        f"{roof['bandwidth_Bps'] / 1e9:.1f} GB/s, float32 matmul "
        f"{roof['flops_per_s'] / 1e9:.0f} GFLOP/s (ridge "
        f"{roof['flops_per_s'] / roof['bandwidth_Bps']:.1f} FLOP/byte); γ = {v['gamma']}.",
        "",
        "| batch | step ms | verified tok/s | vs batch 1 | roofline predicts | roofline ms | "
        "of roofline |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in v["rows"]:
        lines.append(
            f"| {x['batch']} | {x['step_s'] * 1e3:.2f} | {x['verified_tok_s']:.0f} | "
            f"{ratio(x['ratio_to_batch1'])} | {ratio(x['roofline_ratio_to_batch1'])} | "
            f"{x['roofline_s'] * 1e3:.2f} | {x['roofline_fraction']:.0%} |"
        )
    return lines


def wire_md(w: dict[str, Any]) -> list[str]:
    lines = [
        "| encoding | bytes/token (up + down) | up | down | up bytes/block | α | tokens/round |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for x in w["rows"]:
        lines.append(
            f"| {x['encoding']} | {x['bytes_per_token']:.0f} | {x['bytes_up_per_token']:.0f} | "
            f"{x['bytes_down_per_token']:.0f} | {x['bytes_per_block_up']:.0f} | "
            f"{x['alpha']:.3f} | {x['tokens_per_round']:.2f} |"
        )
    return lines
