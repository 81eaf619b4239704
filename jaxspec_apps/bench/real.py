"""The real pair's pass of `jaxspec bench`: SmolLM2-135M-Instruct as the float target and its
own W4A16 copy as the draft (`smollm2-w4a16`, the papers' pair), on chat prompts.

The sections are the suite's (co-located, peer, capacity, RTT, batch sweep, wire cost) plus
Spec-Bench's per-category report (`specbench`), the decode cost of each model against the
roofline (weights and the KV cache each step reads) and the W4A16 quality table. Everything
lands in `results["real"]`; the tiny pair's keys stay at the top level.
"""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec import analytic
from jaxspec.quantize import dequantize, quant_spec, with_kernel
from jaxspec.shapes import bucket
from jaxspec_apps.bench import (
    capacity,
    colocated,
    kernels,
    latency,
    peer,
    quality,
    specbench,
    verifier,
    wirecost,
)
from jaxspec_apps.bench.common import best_time, heldout_stream, prompts_from, run_sections
from jaxspec_apps.bench.profile import Profile

SELF_DRAFT = "smollm2-w4a16"  # the pair's draft: SmolLM2's own W4A16 copy
SMALL_DRAFT = "smollm2-draft"  # the distilled 14M draft for weak devices
REAL_SECTIONS = (
    "specbench",
    "cost",
    "kernels",
    "colocated",
    "peer",
    "verifier",
    "capacity",
    "latency",
    "wirecost",
    "quality",
)


def decode_s_per_token(model: Any, prompt: list[int], new: int, repeats: int) -> float:
    """Seconds per token of plain greedy decoding's loop alone: (t(new) - t(8)) / (new - 8),
    each the best of `repeats` after a warm-up (the prefill and dispatch cancel out)."""

    def timed(n: int) -> float:
        t, _ = best_time(
            lambda: jaxspec.generate(model, prompt, n, temperature=0.0, stop_tokens=()), repeats
        )
        return t

    long, short = timed(new), timed(8)
    if long <= short:  # a loop too fast to difference on a busy machine: the whole call
        return long / new
    return (long - short) / (new - 8)


def cost_variants(target: Any, draft: Any, small: Any | None) -> dict[str, Any]:
    """The models whose decode cost the cost section compares with the pair's: the target in
    bfloat16, and each int4 draft on XLA's path (unpack + dot) next to the int4 kernel's."""
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), target.params)
    out = {"target bf16": target.with_params(bf16, dtype=jnp.bfloat16)}
    for name, m in (("draft", draft), ("small draft", small)):
        if m is not None and quant_spec(m) is not None and quant_spec(m).tiled:
            out[f"{name} (XLA int4 path)"] = with_kernel(m, False)
    if small is not None:
        out["small draft"] = small
    return out


def cost(
    target: Any, draft: Any, prompt: list[int], new: int, repeats: int, roof: dict[str, float],
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Time per token of each model's plain decode loop, the draft's share of the target's
    (`draft_cost_ratio`) and each against its roofline: weight bytes plus the KV bytes one
    step reads (the whole slot, as the jitted step attends over it) ÷ read bandwidth.
    `extras` (name -> model) are timed the same way, for comparison."""
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "new_tokens": new}
    slot = bucket(len(prompt) + new, 64)  # `generate`'s cache length
    for name, m in (("target", target), ("draft", draft), *(extras or {}).items()):
        s = decode_s_per_token(m, prompt, new, repeats)
        kv = verifier.kv_bytes(m, 1, slot)
        floor = (m.nbytes() + kv) / roof["bandwidth_Bps"]
        out[name] = {
            "s_per_token": s,
            "tok_s": 1 / s,
            "weight_bytes": m.nbytes(),
            "kv_bytes_per_step": kv,
            "roofline_s": floor,
            "roofline_fraction": floor / s,
        }
    out["draft_cost_ratio"] = out["draft"]["s_per_token"] / out["target"]["s_per_token"]
    return out


def analytic_speedup(tokens_per_round: float, gamma: int, cost_ratio: float) -> float:
    """The speedup that measured acceptance and cost allow when nothing else costs time: a
    round commits E[A] tokens for gamma draft steps and one verification (taken as one
    target step, the papers' model), i.e. E[A] / (gamma * c + 1)."""
    return tokens_per_round / (gamma * cost_ratio + 1)


def hf_draft_dir(draft: Any, name: str) -> pathlib.Path:
    """A transformers checkpoint of the draft: a quantized draft dequantized to float32
    (transformers has no int4 kernel of ours), a float one as it is."""
    if quant_spec(draft) is None:
        return peer.checkpoint_dir(name)
    d = pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-bench-draft-"))
    jaxspec.save(dequantize(draft), d)
    return d


def quality_rows(
    target: Any,
    drafts: dict[str, Any],
    stream: np.ndarray,
    prompts: list[list[int]],
    p: Profile,
) -> dict[str, Any]:
    """The quality table on this model: each draft (the W4A16 self-draft, the small distilled
    one) with held-out perplexity, agreement and alpha at T = 0 and 0.7."""
    win = {"heldout": quality.spread_windows(stream, p.quality_seq_len + 1, p.quality_windows)}
    evals = [
        (kind, b, rows, quality.target_logp(target.module, target.params, b))
        for kind, b, rows in quality.batches(win, min(4, p.quality_windows))
    ]
    rows = {}
    for label, model in {"target (no draft: the reference)": target, **drafts}.items():
        row = {
            "params": model.num_params(),
            "resident_bytes": model.nbytes(),
            "bytes_vs_target_bf16": model.nbytes() / (2 * target.num_params()),
            **quality.heldout_metrics(model, evals),
        }
        if model is not target:
            row |= quality.acceptance(
                target, model, prompts, p.quality_new_tokens, p.gamma, temperatures=(0.0, 0.7)
            )
        rows[label] = row
    return {
        "rows": rows,
        "windows": len(win["heldout"]),
        "seq_len": p.quality_seq_len,
        "prompts": len(prompts),
        "new_tokens": p.quality_new_tokens,
        "gamma": p.gamma,
    }


def run(
    target_name: str,
    draft_name: str,
    p: Profile,
    log: Callable[[str], None],
    sections: tuple[str, ...] = REAL_SECTIONS,
) -> dict[str, Any]:
    """Every real-pair section `sections` names; a greedy mismatch is recorded in
    `failures` and the other sections still run."""
    target, draft = jaxspec.load(target_name), jaxspec.load(draft_name)
    by_cat = specbench.category_prompts(target, p.specbench_per_category)
    if p.real_prompt_tokens:
        by_cat = {c: [q[: p.real_prompt_tokens] for q in ps] for c, ps in by_cat.items()}
    firsts = [ps[0] for ps in by_cat.values()]  # one prompt per category
    pool = [q for ps in by_cat.values() for q in ps]
    stream = heldout_stream(target)
    log(f"real pair: {target.num_params():,}-param target {target_name}, "
        f"{draft.num_params():,}-param draft {draft_name} ({draft.nbytes():,} bytes)")  # fmt: skip
    res: dict[str, Any] = {
        "models": {
            "target": target_name,
            "draft": draft_name,
            "target_params": target.num_params(),
            "draft_params": draft.num_params(),
            "target_bytes": target.nbytes(),
            "draft_bytes": draft.nbytes(),
            "vocab_size": target.config.vocab_size,
            "draft_quantization": None if quant_spec(draft) is None else str(quant_spec(draft)),
        },
        "sections": {},
        "failures": {},
    }
    shared: dict[str, Any] = {}
    longest = max(len(q) for q in pool)
    g = p.gamma
    max_len = bucket(
        longest + max(p.capacity_new_tokens + 2 * g + 2, p.latency_new_tokens + 10 * g + 8,
                      (p.batch_steps + 3 + verifier.PROFILE_STEPS) * (g + 1) + 8 + g + 1,
                      p.wire_new_tokens + g + 1),
        64,
    )  # fmt: skip

    def roof() -> dict[str, float]:
        if "roof" not in shared:
            shared["roof"] = verifier.measure_roofline(p.roofline_mib, p.roofline_n)
        return shared["roof"]

    def sched() -> Any:
        if "sched" not in shared:
            rows = {1, 2, *p.batches}
            shared["sched"] = verifier.make_scheduler(target, rows=rows, gamma=g, max_len=max_len)
            log(f"real pair: verifier warmed up, rows {sorted(rows)}, slot length {max_len}")
        return shared["sched"]

    def run_specbench() -> dict[str, Any]:
        return specbench.run(
            target, draft, by_cat, new_tokens=p.specbench_new_tokens, gamma=g, repeats=p.repeats
        )

    def run_cost() -> dict[str, Any]:
        # the comparison rows (bf16 target, XLA's int4 path, the small draft): the real pair's
        extras = cost_variants(target, draft, jaxspec.load(SMALL_DRAFT)) if (
            draft_name == SELF_DRAFT) else {}  # fmt: skip
        n, reps = max(p.new_tokens, 40), max(p.repeats, 3)
        return cost(target, draft, firsts[0], n, reps, roof(), extras)

    def run_colocated() -> dict[str, Any]:
        rows = colocated.run(
            target, draft, firsts, gammas=(g,), temperatures=(0.7,),
            new_tokens=p.new_tokens, repeats=p.repeats, modes=p.modes,
        )  # fmt: skip
        return {"rows": rows, "prompts": len(firsts)}

    def run_peer() -> dict[str, Any]:
        return peer.run(
            target, draft, peer.checkpoint_dir(target_name), hf_draft_dir(draft, draft_name),
            firsts[: p.peer_prompts], new_tokens=p.peer_new_tokens, gamma=g, repeats=p.repeats,
        )  # fmt: skip

    def run_verifier() -> dict[str, Any]:
        rows = verifier.batch_sweep(
            target, p.batches, g, p.prompt_len, p.batch_steps, scheduler=sched(), roofline=roof(),
            profile_batches=(p.batches[0], p.batches[-1]),
        )  # fmt: skip
        return {"gamma": g, "roofline": roof(), "rows": rows[1:], "slot_len": max_len}

    def run_capacity() -> dict[str, Any]:
        return capacity.run(target, draft, pool, **capacity.sizes(p))

    def run_latency() -> dict[str, Any]:
        comp, rows = latency.run(
            target, draft, gamma=g, new_tokens=p.latency_new_tokens, temperature=0.0,
            rtts_ms=p.rtts_ms, repeats=p.repeats, prompt=firsts[0], scheduler=sched(),
        )  # fmt: skip
        return {
            "gamma": g,
            "new_tokens": p.latency_new_tokens,
            "components": comp,
            "rows": rows,
            "crossover_ms_measured": latency.crossover_ms(rows, "measured"),
            "crossover_ms_predicted": latency.predicted_crossover_ms(comp, g),
        }

    def run_wirecost() -> dict[str, Any]:
        rows = wirecost.run(
            draft, firsts[: p.wire_prompts], sched(), gamma=g, new_tokens=p.wire_new_tokens,
            sparse_ks=p.wire_sparse_ks,
        )  # fmt: skip
        return {"gamma": g, "new_tokens": p.wire_new_tokens, "rows": rows}

    def run_quality() -> dict[str, Any]:
        qp = prompts_from(stream, p.quality_prompts, p.prompt_len, seed=2)
        drafts = {f"draft `{draft_name}`": draft}
        if draft_name == SELF_DRAFT:  # the pair's default: the small draft beside it
            drafts[f"small draft `{SMALL_DRAFT}`"] = jaxspec.load(SMALL_DRAFT)
        return quality_rows(target, drafts, stream, qp, p)

    unknown = set(sections) - set(REAL_SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {REAL_SECTIONS}")
    runners = {
        "specbench": run_specbench,
        "cost": run_cost,
        "kernels": lambda: kernels.run(target, max(p.repeats, 3)),
        "colocated": run_colocated,
        "peer": run_peer,
        "verifier": run_verifier,
        "capacity": run_capacity,
        "latency": run_latency,
        "wirecost": run_wirecost,
        "quality": run_quality,
    }
    run_sections(runners, sections, res, log, prefix="real ")
    res |= headline(res)
    return res


def headline(res: dict[str, Any]) -> dict[str, Any]:
    """The keys `results["real"]` promises, from the sections that ran."""
    s, out = res["sections"], {}
    if "cost" in s:
        out["plain_roofline_fraction"] = s["cost"]["target"]["roofline_fraction"]
        out["draft_cost_ratio"] = s["cost"]["draft_cost_ratio"]
    if "specbench" in s:
        o = s["specbench"]["overall"]
        out["colocated_speedup"] = o["speedup"]
        out["alpha_t0"] = o["alpha"]
        out["mean_accepted_tokens_t0"] = o["mean_accepted_tokens"]
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
        if hot:
            out["alpha_t07"] = hot[0]["alpha"]
            out["colocated_speedup_t07"] = hot[0]["speedup"]
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
    if "wirecost" in s:
        out["wire_bytes_per_token"] = {
            r["encoding"]: r["bytes_per_token"] for r in s["wirecost"]["rows"]
        }
    return out
