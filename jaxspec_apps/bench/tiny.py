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
from jaxspec_apps.bench.section import Context
from jaxspec_apps.bench.verifier import PROFILE_STEPS

SECTIONS = (
    colocated.TINY,
    peer.SECTION,
    capacity.TINY,
    latency.SECTION,
    verifier.TINY,
    wirecost.SECTION,
    quality.TINY,
)
KEPT = (adaptive.SECTION, fleet.SECTION, openai.SECTION)


def scheduler_len(p: Profile) -> int:
    """A slot length that fits every section's sessions (prompt + new tokens + a block)."""
    g = p.gamma
    need = max(
        p.capacity.new_tokens + 2 * g + 2,
        p.latency.new_tokens + g + 1,
        p.wirecost.new_tokens + g + 1,
        (p.verifier.steps + 3 + PROFILE_STEPS) * (g + 1) + 8 + g + 1,
        4 * g + 16,
    )
    return bucket(p.prompt_len + need, 64)


def prepare(ctx: Context) -> None:
    """Load the pair and draw the held-out prompts every section shares into `ctx`."""
    p = ctx.p
    n_prompts = max(p.colocated.prompts, p.peer.prompts, p.wirecost.prompts)
    ctx.prompts = prompts_from(ctx.stream, n_prompts, p.prompt_len, seed=0)
    ctx.max_len = scheduler_len(p)
    ctx.sched_rows = (1, *p.verifier.batches)


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
