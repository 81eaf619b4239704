"""The real pair's pass of `jaxspec bench`: SmolLM2-135M-Instruct as the float target and its
own W4A16 copy as the draft (`smollm2-w4a16`, the papers' pair), on chat prompts.

Its suite (`SECTIONS`) is the tiny pair's sections (co-located, peer, capacity, RTT, batch
sweep, wire cost, W4A16 quality) plus Spec-Bench's per-category report (`specbench`), the
decode cost of each model against the roofline (`cost`) and the float kernel against XLA's
ops (`kernels`), and llama.cpp's parts beside ours on the same GGUF (`llamacpp`).
Everything lands in `results["real"]`; the tiny pair's keys stay at the top
level. Kept apart (`KEPT`, each run only when named): `target` (plain greedy against
transformers), `int4` (the int4 kernel against XLA's paths), `two_process` (the edge and
the verifier as two pinned processes over gRPC) and `round_profile` (where each mode's time
goes).
"""

from __future__ import annotations

from typing import Any

from jaxspec.compilation.shapes import bucket
from jaxspec.decoding import analytic
from jaxspec.quant.layers import quant_spec
from jaxspec_apps.bench import (
    capacity,
    colocated,
    cost,
    int4,
    kernels,
    latency,
    llamacpp,
    peer,
    quality,
    roundprofile,
    specbench,
    target,
    tiny,
    twoproc,
    verifier,
    wirecost,
)
from jaxspec_apps.bench.section import Context
from jaxspec_apps.bench.verifier import PROFILE_STEPS

SECTIONS = (
    specbench.SECTION,
    cost.SECTION,
    kernels.SECTION,
    colocated.REAL,
    peer.SECTION,
    verifier.REAL,
    capacity.REAL,
    latency.SECTION,
    wirecost.SECTION,
    quality.REAL,
    llamacpp.SECTION,
)
REAL_SECTIONS = tuple(s.name for s in SECTIONS)
# The second real pair (`--pairs gemma3`: Gemma 3 270M and its W4A16 copy, whose drafts are
# rejected at times): acceptance per category, the cost ratio, co-located speedup at T 0 and
# 0.7, the edge/cloud table and llama.cpp beside us on its GGUF, into `results["gemma3"]`.
GEMMA3_SECTIONS = (
    specbench.SECTION,
    cost.SECTION,
    colocated.REAL,
    latency.SECTION,
    llamacpp.SECTION,
)
# pass name -> (target, draft, its sections); the tiny pair's pass is `jaxspec_apps.bench.tiny`
REAL_PASSES = {
    "real": ("smollm2", "smollm2-w4a16", SECTIONS),
    "gemma3": ("gemma3", "gemma3-w4a16", GEMMA3_SECTIONS),
}
KEPT = (target.SECTION, int4.SECTION, twoproc.SECTION, roundprofile.SECTION)


def prepare(ctx: Context) -> None:
    """Load the pair and build the chat prompts every section shares into `ctx`: each
    Spec-Bench category's (cut to `real_prompt_tokens` for tiny models), the first of each
    as the pass's `prompts`, and the shared verifier's slot length and row buckets."""
    p, g = ctx.p, ctx.p.gamma
    by_cat = specbench.category_prompts(ctx.target, p.specbench.per_category)
    if p.real_prompt_tokens:
        by_cat = {c: [q[: p.real_prompt_tokens] for q in ps] for c, ps in by_cat.items()}
    ctx.by_category = by_cat
    ctx.prompts = [ps[0] for ps in by_cat.values()]  # one prompt per category
    longest = max(len(q) for q in ctx.pool)
    ctx.max_len = bucket(
        longest + max(p.capacity.new_tokens + 2 * g + 2, p.latency.new_tokens + 10 * g + 8,
                      (p.verifier.steps + 3 + PROFILE_STEPS) * (g + 1) + 8 + g + 1,
                      p.wirecost.new_tokens + g + 1),
        64,
    )  # fmt: skip
    ctx.sched_rows = (1, 2, *p.verifier.batches)


def models(ctx: Context) -> dict[str, Any]:
    """`results["real"]["models"]`: the pair's names, sizes (`tiny.models`), vocabulary and
    quantization."""
    d = ctx.draft
    return tiny.models(ctx) | {
        "vocab_size": ctx.target.config.vocab_size,
        "draft_quantization": None if quant_spec(d) is None else str(quant_spec(d)),
    }


def analytic_speedup(tokens_per_round: float, gamma: int, cost_ratio: float) -> float:
    """The speedup that measured acceptance and cost allow when nothing else costs time: a
    round commits E[A] tokens for gamma draft steps and one verification (taken as one
    target step, the papers' model), i.e. E[A] / (gamma * c + 1)."""
    return tokens_per_round / (gamma * cost_ratio + 1)


def headline(res: dict[str, Any]) -> dict[str, Any]:
    """The keys `results["real"]` promises, from the sections that ran."""
    s, out = res["sections"], {}
    if "cost" in s:
        out["plain_roofline_fraction"] = s["cost"]["target"]["roofline_fraction"]
        out["draft_cost_ratio"] = s["cost"]["draft_cost_ratio"]
    if "specbench" in s:
        o = s["specbench"]["overall"]
        out["colocated_speedup"] = o["speedup"]
        if "auto" in s["specbench"]:  # the headline is gamma="auto"'s, gamma 4's beside it
            out["colocated_speedup_gamma4"] = o["speedup"]
            out["colocated_speedup"] = s["specbench"]["auto"]["overall"]["speedup"]
            out["colocated_auto_gammas"] = sorted(set(s["specbench"]["auto"]["overall"]["gammas"]))
        if "parts" in s["specbench"]:
            pa = s["specbench"]["parts"]
            out["colocated_parts_speedup"] = pa["speedup"]
            out["colocated_vs_parts"] = o["speedup"] / pa["speedup"]
        out["alpha_t0"] = o["alpha"]
        out["tokens_per_round_t0"] = o["tokens_per_round"]
        if "cost" in s:
            a = analytic_speedup(o["tokens_per_round"], s["specbench"]["gamma"],
                                 s["cost"]["draft_cost_ratio"])  # fmt: skip
            out["colocated_analytic_speedup"] = a
            out["colocated_vs_analytic"] = o["speedup"] / a
            out["colocated_analytic_speedup_iid"] = float(
                analytic.expected_tokens(o["alpha"], s["specbench"]["gamma"])
            ) / (s["specbench"]["gamma"] * s["cost"]["draft_cost_ratio"] + 1)
    if "colocated" in s:
        hot = [r for r in s["colocated"]["rows"] if r["temperature"] > 0]
        auto = [r for r in hot if r["gamma"] == "auto" and r["mode"] == "sync"]
        if hot:
            out["alpha_t07"] = hot[0]["alpha"]
            out["colocated_speedup_t07"] = (auto or hot)[0]["speedup"]
            if auto:
                out["colocated_speedup_t07_gamma4"] = hot[0]["speedup"]
    if "peer" in s:
        out["peer_plain_ratio"] = s["peer"]["peer_plain_ratio"]
        out["peer_spec_ratio"] = s["peer"]["peer_spec_ratio"]
    if "verifier" in s:
        rows = s["verifier"]["rows"]
        out["verify_roofline_fraction"] = {str(r["batch"]): r["roofline_fraction"] for r in rows}
        if "cost" in s and rows[0]["batch"] == 1:  # both timed in this run
            out["verify_over_decode"] = rows[0]["step_s"] / s["cost"]["target"]["s_per_token"]
    if "capacity" in s:
        c = s["capacity"]
        out["capacity_factor_measured"] = c["capacity_factor_measured"]
        out["capacity_factor_predicted"] = c["capacity_factor_predicted"]
        out["capacity_vs_cloud_ar"] = c["edge_over_cloud_ar"]
    if "quality" in s:
        rows = list(s["quality"]["rows"].values())
        ref, d = rows[0], rows[1]  # the target, then the pair's draft
        out["selfdraft_alpha_t0"] = d["alpha_t0"]
        out["selfdraft_alpha_t07"] = d["alpha_t0.7"]
        out["selfdraft_agreement"] = d["greedy_agreement"]
        out["selfdraft_ppl_ratio"] = d["ppl"] / ref["ppl"]
    if "llamacpp" in s:
        out["vs_llamacpp"] = s["llamacpp"]["vs_llamacpp"]
        out["decode_bandwidth_fraction"] = s["llamacpp"]["decode_bandwidth_fraction"]
        for key in ("decode_bandwidth_fraction_bf16", "w4a16_over_f32"):
            if key in s["llamacpp"]:
                out[key] = s["llamacpp"][key]
    if "wirecost" in s:
        out["wire_bytes_per_token"] = {
            r["encoding"]: r["bytes_per_token"] for r in s["wirecost"]["rows"]
        }
    return out
