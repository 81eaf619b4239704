"""The real pair's part of BENCHMARKS.md (`results["real"]`, see `jaxspec_apps.bench.real`)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench import kernels, latency
from jaxspec_apps.bench.report_tables import (
    capacity_md,
    headline_md,
    machine_line,
    peer_md,
    ratio,
    verifier_md,
    wire_md,
)

HEADLINE = [
    ("colocated_speedup", "co-located speculative ÷ plain tokens/s, T = 0, batch 1 (Spec-Bench)"),
    ("colocated_analytic_speedup", "what the measured E[A] and cost ratio allow: E[A]/(γc + 1)"),
    ("colocated_vs_analytic", "measured ÷ that analytic speedup"),
    ("alpha_t0", "accepted ÷ drafted, T = 0"),
    ("mean_accepted_tokens_t0", "tokens committed per verification, T = 0 (Spec-Bench's τ)"),
    ("alpha_t07", "accepted ÷ drafted, T = 0.7"),
    ("draft_cost_ratio", "draft token time ÷ target token time (plain decode loops)"),
    ("plain_roofline_fraction", "target's plain decode: roofline time ÷ measured time"),
    ("peer_plain_ratio", "our plain greedy ÷ transformers' plain greedy tokens/s"),
    ("peer_spec_ratio", "our speculative ÷ transformers' (faster) assisted generation tokens/s"),
    ("capacity_factor_measured", "clients sustained, edge-cloud SD ÷ co-located SD"),
    ("capacity_factor_predicted", "1 + γ·t_d/t_v at t_d, t_v measured where co-located saturates"),
    ("capacity_vs_cloud_ar", "clients sustained, edge-cloud SD ÷ cloud autoregressive"),
    ("verify_over_decode", "verify step at batch 1 (γ + 1 positions) ÷ one plain decode token"),
]


def _headline(r: dict[str, Any]) -> list[str]:
    middle = []
    if "verify_roofline_fraction" in r:
        v = ", ".join(f"B={b}: {f:.2f}" for b, f in r["verify_roofline_fraction"].items())
        middle.append(
            f"| `verify_roofline_fraction` | {v} | verify step: roofline (weights + live KV) ÷ "
            "measured, by batch |"
        )
    return headline_md(HEADLINE, r, middle)


def _specbench(sb: dict[str, Any]) -> list[str]:
    g = sb["gamma"]
    lines = [
        "| category | prompts | plain tok/s | SD tok/s | speedup | mean accepted tokens τ | α | "
        + " | ".join(f"pos {i + 1}" for i in range(g))
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * g,
    ]
    for row in [*sb["rows"], sb["overall"]]:
        name = f"**{row['category']}**" if row["category"] == "overall" else row["category"]
        pos = " | ".join(f"{a:.2f}" for a in row["per_position_acceptance"])
        lines.append(
            f"| {name} | {row['prompts']} | {row['plain_tok_s']:.1f} | {row['spec_tok_s']:.1f} | "
            f"{ratio(row['speedup'])} | {row['mean_accepted_tokens']:.2f} | {row['alpha']:.3f} | "
            f"{pos} |"
        )
    return lines


def _cost(c: dict[str, Any], roof: dict[str, float] | None) -> list[str]:
    lines = [
        "| model | ms/token | tok/s | weight bytes | KV bytes/step | roofline ms | of roofline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = ["target", "draft"] + [k for k, v in c.items() if isinstance(v, dict) and k not in
                                    ("target", "draft")]  # fmt: skip
    for name in names:
        m = c[name]
        lines.append(
            f"| {name} | {m['s_per_token'] * 1e3:.2f} | {m['tok_s']:.1f} | "
            f"{m['weight_bytes']:,} | {m['kv_bytes_per_step']:,} | {m['roofline_s'] * 1e3:.2f} | "
            f"{m['roofline_fraction']:.0%} |"
        )
    bw = f" at {roof['bandwidth_Bps'] / 1e9:.1f} GB/s read bandwidth" if roof else ""
    lines += [
        "",
        f"Plain greedy decode loops, batch 1, {c['new_tokens']} tokens after a "
        f"{c['prompt_tokens']}-token chat prompt: (t(N) − t(8)) / (N − 8), so the prefill and "
        f"dispatch cancel out. Roofline: (weight + KV bytes one step reads) ÷ bandwidth{bw}. "
        f"Draft cost ratio c = **{c['draft_cost_ratio']:.3f}**. An int4 model runs its "
        f"matmuls of up to 16 rows on the int4 kernel (jaxspec/csrc, an XLA FFI custom call) "
        f'where it is built; its "XLA int4 path" row is the same model through XLA\'s unpack '
        f"and AQT's int dot.",
    ]
    return lines


def _quality(q: dict[str, Any]) -> list[str]:
    lines = [
        f"Held-out perplexity on {q['windows']} windows of {q['seq_len']} tokens of the "
        "stdlib documents the pairs never trained on, teacher-forced greedy agreement with the "
        f"target there, and α of co-located decoding (γ = {q['gamma']}) on {q['prompts']} "
        f"prompts × {q['new_tokens']} tokens.",
        "",
        "| model | params | resident bytes | × target bf16 | held-out ppl | greedy agreement | "
        "α T=0 | α T=0.7 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in q["rows"].items():
        a0 = f"{r['alpha_t0']:.3f}" if "alpha_t0" in r else "—"
        a1 = f"{r['alpha_t0.7']:.3f}" if "alpha_t0.7" in r else "—"
        lines.append(
            f"| {label} | {r['params']:,} | {r['resident_bytes']:,} | "
            f"{r['bytes_vs_target_bf16']:.3f} | {r['ppl']:.2f} | {r['greedy_agreement']:.3f} | "
            f"{a0} | {a1} |"
        )
    return lines


def markdown(r: dict[str, Any]) -> list[str]:
    """The real pair's section: headline, Spec-Bench table, cost, then the suite's tables."""
    s, p, m = r["sections"], r["profile_settings"], r["models"]
    lines = [
        f"## The real pair: `{m['target']}` and its draft `{m['draft']}`",
        "",
        f"Produced by `{r['command']}` in the same run ({r['wall_time_s'] / 60:.1f} min of it) "
        f"on {machine_line(r)}. Target `{m['target']}` ({m['target_params']:,} parameters, "
        f"{m['target_bytes']:,} bytes as loaded), draft `{m['draft']}` "
        f"({m['draft_params']:,} parameters, {m['draft_bytes']:,} bytes resident, "
        f"{m['draft_quantization'] or 'float'}). Prompts are chat-formatted questions written "
        "for the benchmark (`jaxspec_apps/bench/specbench.py`), none from the draft's training. "
        "Machine-readable: `bench/results.json`, object `real`.",
        *(
            f"Sections {', '.join(e['sections'])} (and their headline keys) come from an "
            f"earlier run, `{e['command']}` ({e['wall_time_s'] / 60:.1f} min)."
            for e in r.get("earlier_runs", [])
        ),
        "",
        *_headline(r),
    ]
    if "specbench" in s:
        sb = s["specbench"]
        lines += [
            "",
            "### Spec-Bench: speedup and mean accepted tokens per category (T = 0, batch 1)",
            "",
            f"γ = {sb['gamma']}, sync, {sb['new_tokens']} new tokens per prompt (stop tokens "
            f"ignored so every answer has that length), plain and speculative timed in turns "
            f"(the best of {p['repeats']} after a warm-up). Greedy speculative tokens are "
            "asserted equal to plain greedy tokens. τ = tokens committed per verification "
            "(bonus included); pos i = the share of rounds whose draft i was accepted.",
            "",
            *_specbench(sb),
        ]
    if "cost" in s:
        lines += [
            "",
            "### Cost per token against the roofline",
            "",
            *_cost(s["cost"], s.get("verifier", {}).get("roofline")),
        ]
    if "kernels" in s:
        lines += ["", "### The float kernel against XLA (batch-invariant matmul, attention)", ""]
        lines += kernels.markdown(s["kernels"])
    if "colocated" in s:
        temps = ", ".join(f"{row['temperature']:g}" for row in s["colocated"]["rows"])
        lines += ["", f"### Co-located at T = {temps}", ""]
        for row in s["colocated"]["rows"]:
            lines.append(
                f"T = {row['temperature']:g}, γ = {row['gamma']}, {row['mode']}, "
                f"{row['prompts']} prompts (one per category): plain {row['plain_tok_s']:.1f} "
                f"tok/s, speculative {row['spec_tok_s']:.1f} tok/s, **{ratio(row['speedup'])}**, "
                f"α {row['alpha']:.3f}, {row['tokens_per_round']:.2f} tokens per round."
            )
    if "peer" in s:
        pr = s["peer"]
        lines += [
            "",
            "### Peer: transformers on the same pair",
            "",
            f"transformers {pr['transformers']}, torch {pr['torch']} ({pr['torch_threads']} "
            "threads, float32); the draft given to transformers is ours dequantized to float32 "
            "(`jaxspec.quantize.dequantize`: same weights, float matmuls). Greedy, batch 1, "
            f"{pr['prompts']} prompts, {pr['new_tokens']} new tokens in all, default stop "
            "tokens; **all five decoders gave identical tokens (asserted)**.",
            "",
            *peer_md(pr),
            "",
            f"Ours ÷ theirs: plain **{ratio(pr['peer_plain_ratio'])}**, speculative "
            f"**{ratio(pr['peer_spec_ratio'])}**. Speculative ÷ plain: ours "
            f"{ratio(pr['ours_spec_speedup'])}, transformers {ratio(pr['hf_assisted_speedup'])}.",
        ]
    if "verifier" in s:
        v = s["verifier"]
        lines += [
            "",
            "### Verifier batch sweep (weights + live KV bytes in the roofline)",
            "",
            f"Slot length {v['slot_len']}; the step reads its KV bucket "
            f"({', '.join(str(r['attended']) for r in v['rows'])} positions a row, by batch), "
            "the roofline counts the live positions only.",
            "",
            *verifier_md(v),
            *_step_profile(v["rows"]),
        ]
    if "capacity" in s:
        lines += ["", "### Capacity", "", *capacity_md(s["capacity"])]
    if "latency" in s:
        lat = s["latency"]
        lines += [
            "",
            "### RTT sweep",
            "",
            f"Greedy, γ = {lat['gamma']}, {lat['new_tokens']} tokens, one chat prompt, edge "
            "and verifier in this process behind `edge.DelayedEndpoint`.",
            "",
            latency.table_md(lat["components"], lat["rows"], lat["gamma"]).rstrip(),
        ]
    if "wirecost" in s:
        w = s["wirecost"]
        lines += [
            "",
            f"### Wire bytes per token at a {m['vocab_size']:,}-entry vocabulary",
            "",
            f"Sampled (T = {w['rows'][0]['temperature']:g}), sync, γ = {w['gamma']}, "
            f"{w['new_tokens']} tokens per session; protobuf bytes up and down per committed "
            "token.",
            "",
            *wire_md(w),
        ]
    if "quality" in s:
        lines += ["", "### W4A16 on this model: self-speculation and the shipped draft", ""]
        lines += _quality(s["quality"])
    if r.get("skipped"):
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    return lines


def _step_profile(rows: list[dict[str, Any]]) -> list[str]:
    """Where the step's time goes (jax.profiler, `jaxspec_apps.bench.stepprofile`)."""
    prof = [r for r in rows if "profile" in r]
    if not prof:
        return []
    cats = ("weight matmuls", "logits", "attention", "rule", "other")
    lines = [
        "",
        "Where the step's time goes (one `jax.profiler` trace of two steps, XLA op time by "
        "source op; `jaxspec_apps/bench/stepprofile.py`):",
        "",
        "| batch | " + " | ".join(cats) + " | op ms per step | step ms |",
        "|---:|" + "---:|" * (len(cats) + 2),
    ]
    for r in prof:
        f = r["profile"]["fractions"]
        lines.append(
            f"| {r['batch']} | " + " | ".join(f"{f.get(c, 0.0):.0%}" for c in cats)
            + f" | {r['profile']['op_seconds'] * 1e3:.1f} | {r['step_s'] * 1e3:.1f} |"
        )  # fmt: skip
    one = prof[0]
    mm = sum(one["profile"]["fractions"].get(c, 0.0) for c in ("weight matmuls", "logits"))
    lines += [
        "",
        f"At batch {one['batch']} {mm:.0%} of the op time is the weight matmuls and the tied "
        "logits (on the CPU the float kernel's custom calls, `jaxspec.floatkernel`): the step "
        "reads every weight once, as the roofline assumes, so its gap to the roofline "
        f"({one['roofline_fraction']:.0%} of it) is mostly the gap between those matmuls at a "
        "few rows and the bandwidth `jnp.sum` reaches over one buffer. At larger "
        "batches the step turns compute-bound on this CPU (its ridge point is a few FLOP per "
        "byte), and the share of attention and the rule grows with the rows.",
    ]
    return lines
