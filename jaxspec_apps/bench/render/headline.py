"""The headline tables of the pairs' parts of the report, and the tiny pair's "where we are
behind" sentences, chosen by the measured numbers."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import headline_md, labels, ratio

TINY_HEADLINE = labels("headline_tiny")


def tiny_table(r: dict[str, Any]) -> list[str]:
    """The headline table of the tiny pair's report."""
    middle = []
    if "roofline_fraction" in r:
        rf = r["roofline_fraction"]
        middle.append(
            f"| `roofline_fraction` | {rf['batch1']:.2f} / {rf['batch32']:.2f} | the verify "
            "step's achieved share of the bound, batch 1 / batch 32 |"
        )
    return headline_md(TINY_HEADLINE, r, middle)


def behind(r: dict[str, Any]) -> list[str]:
    """Plain sentences on where we lose, chosen by the measured numbers."""
    s, out = r["sections"], []
    if "peer" in s:
        pr = s["peer"]
        if pr["peer_plain_ratio"] < 1:
            out.append(
                f"transformers' plain greedy decoding is faster than ours on these checkpoints "
                f"({ratio(1 / pr['peer_plain_ratio'])} our tokens/s)."
            )
        if pr["peer_spec_ratio"] < 1:
            out.append(
                f"transformers' assisted generation is faster than our speculative decoding "
                f"({ratio(1 / pr['peer_spec_ratio'])} ours)."
            )
    if "colocated" in s:
        for label, rows in (
            ("the draft", "default_pair"),
            ("self-speculation", "self_w4a16"),
        ):
            slow = [x for x in s["colocated"][rows] if x["speedup"] < 1]
            if slow:
                cases = ", ".join(
                    f"T={x['temperature']:g} γ={x['gamma']} {x['mode']} {ratio(x['speedup'])}"
                    for x in slow
                )
                out.append(f"Speculative decoding with {label} is slower than plain in: {cases}.")
    if "capacity" in s:
        c = s["capacity"]
        if c["capacity_factor_measured"] < c["capacity_factor_predicted"]:
            out.append(
                f"Offloading the drafts gains fewer clients than the paper's model predicts "
                f"({ratio(c['capacity_factor_measured'])} measured vs "
                f"{ratio(c['capacity_factor_predicted'])} predicted)."
            )
        if c["edge_over_cloud_ar"] < 1:
            out.append(
                "At this per-client rate, edge-cloud speculative decoding sustains fewer clients "
                f"than plain cloud decoding ({ratio(c['edge_over_cloud_ar'])})."
            )
    if "latency" in s:
        lat = s["latency"]
        slower = [
            row["rtt_ms"]
            for row in lat["rows"]
            if row["measured"]["pipelined"] > row["measured"]["colocated"]
        ]
        if slower:
            out.append(
                "Pipelined edge-cloud decoding is slower per token than co-located speculative "
                f"decoding at every swept RTT from {slower[0]} ms on, as the DSD paper predicts."
            )
    if "verifier" in s:
        rows = s["verifier"]["rows"]
        best = max(rows, key=lambda x: x["roofline_fraction"])
        if best["roofline_fraction"] < 0.5:
            at = "one row as well" if best["batch"] == 1 else f"{best['batch']} rows"
            out.append(
                f"The verify step runs at {rows[0]['roofline_fraction']:.0%} of this machine's "
                f"roofline with one row and at best {best['roofline_fraction']:.0%} (at {at}): "
                "per-op and host overheads, not bytes or FLOPs, bound it."
            )
    return out


REAL_HEADLINE = labels("headline_real")


def real_table(r: dict[str, Any]) -> list[str]:
    """The headline table of the real pair's report."""
    middle = []
    if "verify_roofline_fraction" in r:
        v = ", ".join(f"B={b}: {f:.2f}" for b, f in r["verify_roofline_fraction"].items())
        middle.append(
            f"| `verify_roofline_fraction` | {v} | verify step: roofline (weights + live KV) ÷ "
            "measured, by batch |"
        )
    if "vs_llamacpp" in r:
        v = ", ".join(f"{k} {x:.2f}" for k, x in r["vs_llamacpp"].items())
        middle.append(f"| `vs_llamacpp` | {v} | ours ÷ llama.cpp tokens/s, same GGUF and cores |")
    return headline_md(REAL_HEADLINE, r, middle)
