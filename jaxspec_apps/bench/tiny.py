"""The tiny pair's pass of `jaxspec bench`: the shipped 5.4M target and its draft (or any
`--target` / `--draft`), on windows of the documents held out of their training.

Its suite (`SECTIONS`, run in this order, each in its own module): co-located vs plain,
the peer (transformers), capacity, the RTT sweep, the verifier's batch sweep, wire cost and
W4A16 quality. Kept apart (`KEPT`, each run only when named, its own block of the report):
adaptive gamma, a fleet of verifiers, the OpenAI-compatible endpoint.
"""

from __future__ import annotations

from typing import Any

from jaxspec.compilation.shapes import bucket
from jaxspec_apps.bench import (
    adaptive,
    capacity,
    colocated,
    fleet,
    latency,
    openai,
    peer,
    quality,
    verifier,
    wirecost,
)
from jaxspec_apps.bench.common import prompts_from
from jaxspec_apps.bench.profile import Profile
from jaxspec_apps.bench.report_tables import headline_md, ratio
from jaxspec_apps.bench.section import Context
from jaxspec_apps.bench.verifier import PROFILE_STEPS

SECTIONS = (
    colocated.TINY,
    peer.TINY,
    capacity.TINY,
    latency.TINY,
    verifier.TINY,
    wirecost.TINY,
    quality.TINY,
)
KEPT = (adaptive.SECTION, fleet.SECTION, openai.SECTION)


def scheduler_len(p: Profile) -> int:
    """A slot length that fits every section's sessions (prompt + new tokens + a block)."""
    g = p.gamma
    need = max(
        p.capacity_new_tokens + 2 * g + 2,
        p.latency_new_tokens + g + 1,
        p.wire_new_tokens + g + 1,
        (p.batch_steps + 3 + PROFILE_STEPS) * (g + 1) + 8 + g + 1,
        4 * g + 16,
    )
    return bucket(p.prompt_len + need, 64)


def prepare(ctx: Context) -> None:
    """Load the pair and draw the held-out prompts every section shares into `ctx`."""
    p = ctx.p
    n_prompts = max(p.prompts, p.peer_prompts, p.wire_prompts)
    ctx.prompts = prompts_from(ctx.stream, n_prompts, p.prompt_len, seed=0)
    ctx.max_len = scheduler_len(p)
    ctx.sched_rows = (1, *p.batches)


def models(ctx: Context) -> dict[str, Any]:
    """`results["models"]`: the pair's names, sizes and bytes."""
    target, draft = ctx.target, ctx.draft
    return {
        "target": ctx.target_name,
        "draft": ctx.draft_name,
        "target_params": target.num_params(),
        "draft_params": draft.num_params(),
        "target_bytes": target.nbytes(),
        "draft_bytes": draft.nbytes(),
    }


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The keys `bench/results.json` promises, from the sections that ran."""
    s = results["sections"]
    out: dict[str, Any] = {}
    if "colocated" in s:
        p = results["profile_settings"]
        rows = [
            r
            for r in s["colocated"]["default_pair"]
            if r["temperature"] == 0.0 and r["gamma"] == p["gamma"] and r["mode"] == "sync"
        ]
        if len(rows) == 1:  # (not when --set leaves the headline's configuration out)
            out["colocated_speedup"] = rows[0]["speedup"]
    if "peer" in s:
        out["peer_plain_ratio"] = s["peer"]["peer_plain_ratio"]
        out["peer_spec_ratio"] = s["peer"]["peer_spec_ratio"]
    if "verifier" in s:
        by_batch = {r["batch"]: r for r in s["verifier"]["rows"]}
        if 1 in by_batch and 32 in by_batch:
            b32 = by_batch[32]
            out["batch32_over_batch1"] = b32["ratio_to_batch1"]
            out["batch_scaling_vs_roofline"] = (
                b32["ratio_to_batch1"] / b32["roofline_ratio_to_batch1"]
            )
            out["roofline_fraction"] = {
                "batch1": by_batch[1]["roofline_fraction"],
                "batch32": b32["roofline_fraction"],
            }
    if "capacity" in s:
        out["capacity_factor_measured"] = s["capacity"]["capacity_factor_measured"]
        out["capacity_factor_predicted"] = s["capacity"]["capacity_factor_predicted"]
    if "latency" in s:
        at50 = [r for r in s["latency"]["rows"] if r["rtt_ms"] == 50]
        if at50:
            m = at50[0]["measured"]
            out["pipelined_over_sync_at_50ms"] = m["sync"] / m["pipelined"]
    if "wirecost" in s and "rows" in s["wirecost"]:
        out["wire_bytes_per_token"] = {
            r["encoding"]: r["bytes_per_token"] for r in s["wirecost"]["rows"]
        }
    if "quality" in s:
        for k in ("w4a16_bytes_ratio", "w4a16_ppl_ratio", "w4a16_alpha_ratio"):
            out[k] = s["quality"][k]
    return out


HEADLINE = [
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


def headline_table(r: dict[str, Any]) -> list[str]:
    """The headline table of the tiny pair's report."""
    middle = []
    if "roofline_fraction" in r:
        rf = r["roofline_fraction"]
        middle.append(
            f"| `roofline_fraction` | {rf['batch1']:.2f} / {rf['batch32']:.2f} | the verify "
            "step's achieved share of the bound, batch 1 / batch 32 |"
        )
    return headline_md(HEADLINE, r, middle)


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
