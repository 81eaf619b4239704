"""The headline tables of the pairs' parts of the report, and the tiny pair's "where we are
behind" sentences, chosen by the measured numbers."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import headline_md, ratio

TINY_HEADLINE = [
    ("colocated_speedup", "co-located speculative ÷ plain tokens/s (target + draft, greedy, sync)"),
    ("peer_plain_ratio", "our plain greedy ÷ transformers' plain greedy tokens/s"),
    ("peer_spec_ratio", "our speculative ÷ transformers' (faster) assisted generation tokens/s"),
    ("batch32_over_batch1", "verified tokens/s, batch 32 ÷ batch 1"),
    ("batch_scaling_vs_roofline", "that ratio ÷ the roofline's ratio for the same model"),
    ("capacity_factor_measured", "clients sustained, edge-cloud SD ÷ co-located SD"),
    ("capacity_factor_predicted", "the paper's 1 + γ·t_d/t_v at measured t_d, t_v"),
    ("pipelined_over_sync_at_50ms", "pipelined ÷ sync edge-cloud tokens/s at 50 ms RTT"),
    ("w4a16_bytes_ratio", "W4A16 draft resident bytes ÷ bf16"),
    ("w4a16_ppl_ratio", "W4A16 draft held-out perplexity ÷ unquantized"),
    ("w4a16_alpha_ratio", "α with the W4A16 draft ÷ with the unquantized draft (T = 1)"),
]


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


REAL_HEADLINE = [
    (
        "colocated_speedup",
        "co-located speculative ÷ plain tokens/s, T = 0, batch 1 (Spec-Bench; "
        "γ auto where the run had it)",
    ),
    ("colocated_speedup_gamma4", "the same at the fixed γ"),
    ("colocated_parts_speedup", "what a round of exactly its forwards allows (in-loop times)"),
    ("colocated_vs_parts", "measured (fixed γ) ÷ that"),
    ("colocated_analytic_speedup", "what the measured E[A] and cost ratio allow: E[A]/(γc + 1)"),
    ("colocated_vs_analytic", "measured ÷ that analytic speedup"),
    ("alpha_t0", "accepted ÷ drafted, T = 0"),
    ("tokens_per_round_t0", "tokens committed per verification, T = 0 (Spec-Bench's τ)"),
    ("alpha_t07", "accepted ÷ drafted, T = 0.7"),
    ("draft_cost_ratio", "draft token time ÷ target token time (plain decode loops)"),
    ("plain_roofline_fraction", "target's plain decode: roofline time ÷ measured time"),
    ("peer_plain_ratio", "our plain greedy ÷ transformers' plain greedy tokens/s"),
    ("peer_spec_ratio", "our speculative ÷ transformers' (faster) assisted generation tokens/s"),
    ("capacity_factor_measured", "clients sustained, edge-cloud SD ÷ co-located SD"),
    ("capacity_factor_predicted", "1 + γ·t_d/t_v at t_d, t_v measured where co-located saturates"),
    ("capacity_vs_cloud_ar", "clients sustained, edge-cloud SD ÷ cloud autoregressive"),
    ("verify_over_decode", "verify step at batch 1 (γ + 1 positions) ÷ one plain decode token"),
    ("decode_bandwidth_fraction", "float32 decode: bytes per token ÷ time ÷ probed bandwidth"),
    ("decode_bandwidth_fraction_bf16", "the same for the bfloat16 target"),
    ("w4a16_over_f32", "a W4A16 decode token's time ÷ a float32 one's (2 threads)"),
]


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
