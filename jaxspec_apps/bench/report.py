"""BENCHMARKS.md and the plots, from the results of one `jaxspec bench` run.

Every number printed comes from `results` (what the run measured); the sentences that say
who is ahead are chosen by those numbers, so a rerun on another machine says what it saw.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from jaxspec import analytic
from jaxspec_apps.bench import latency, real_report
from jaxspec_apps.bench.report_tables import (
    capacity_md,
    headline_md,
    machine_line,
    peer_md,
    ratio,
    verifier_md,
    wire_md,
)


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


def _colocated_md(c: dict[str, Any]) -> list[str]:
    lines = [
        "| draft | temp | γ | mode | plain tok/s | spec tok/s | speedup | α | tokens/round |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for label, key in (("draft", "default_pair"), ("W4A16 target (self)", "self_w4a16")):
        for x in c[key]:
            lines.append(
                f"| {label} | {x['temperature']:g} | {x['gamma']} | {x['mode']} | "
                f"{x['plain_tok_s']:.0f} | {x['spec_tok_s']:.0f} | {ratio(x['speedup'])} | "
                f"{x['alpha']:.3f} | {x['tokens_per_round']:.2f} |"
            )
    return lines


def _capacity_feasible(c: dict[str, Any], lat: dict[str, Any] | None) -> list[str]:
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


def _verifier_note(rows: list[dict[str, Any]]) -> str:
    """What the batch sweep says against the bound, in words chosen by the numbers."""
    one, top = rows[0], max(rows, key=lambda x: x["ratio_to_batch1"])
    if top["ratio_to_batch1"] > top["roofline_ratio_to_batch1"]:
        return (
            f"Batching scales past the bound's ratio ({ratio(top['ratio_to_batch1'])} at "
            f"{top['batch']} rows vs {ratio(top['roofline_ratio_to_batch1'])}) because one row is "
            f"far from the bound ({one['roofline_fraction']:.0%} of it: per-op and host "
            "overheads dominate), and rows share those overheads; the achieved fraction rises "
            f"to {top['roofline_fraction']:.0%}. The roofline ratio is small because this CPU "
            "turns compute-bound after a few rows (its ridge point is a few FLOP/byte)."
        )
    return (
        f"Batching gains {ratio(top['ratio_to_batch1'])} at {top['batch']} rows, below the "
        f"{ratio(top['roofline_ratio_to_batch1'])} the bound allows."
    )


def _latency_note(lat: dict[str, Any]) -> str:
    """Where pipelined beats sync and co-located decoding, measured."""
    rows = lat["rows"]

    def where(pred: Any) -> str:
        hits = [str(r["rtt_ms"]) for r in rows if pred(r["measured"])]
        return f"at RTT {', '.join(hits)} ms" if hits else "at no swept RTT"

    zero = [r for r in rows if r["rtt_ms"] == 0]
    extra = ""
    if zero:
        comp, g = lat["components"], lat["gamma"]
        e_a = analytic.expected_tokens(comp["alpha"], g)
        model = g * comp["t_d"] + comp["t_v"]
        gap = zero[0]["measured"]["sync"] * e_a - model
        extra = (
            f" At RTT 0 a sync round takes about {gap * 1e3:.1f} ms more than the model's "
            f"γ·t_d + t_v = {model * 1e3:.1f} ms: what an edge session pays per round besides "
            "drafting and the verify step (the drafter's rollback and append, the hop from "
            "asyncio into the verifier's thread, the scheduler's host-side work), which the "
            "model leaves out."
        )
    return (
        "Measured: pipelined beats sync edge-cloud decoding "
        + where(lambda m: m["pipelined"] < m["sync"])
        + "; it beats co-located speculative decoding "
        + where(lambda m: m["pipelined"] < m["colocated"])
        + ", and cloud autoregressive decoding "
        + where(lambda m: m["pipelined"] < m["cloud_ar"])
        + "."
        + extra
    )


def _wire_note(rows: list[dict[str, Any]]) -> list[str]:
    by = {x["encoding"]: x for x in rows}
    lines = [
        "α is accepted ÷ drafted (drafts after a rejection count), so a per-position "
        "acceptance a gives α ≈ a(1 − a^γ) / ((1 − a)γ)."
    ]
    if "full" in by and any(x["alpha"] < by["full"]["alpha"] for x in rows):
        cheapest = min(rows, key=lambda x: x["bytes_per_token"])
        times = by["full"]["bytes_per_token"] / cheapest["bytes_per_token"]
        lines[0] += (
            " A top-k or one-hot q can only be accepted where the target puts mass on the "
            "draft's few candidates; with a flat target distribution that costs α and so more "
            "rounds per token (included in the bytes per token). Here `full` buys α "
            f"{by['full']['alpha']:.2f} for {times:,.0f}× "
            f"the bytes of `{cheapest['encoding']}` (α {cheapest['alpha']:.2f})."
        )
    return lines


def _quality_md(q: dict[str, Any]) -> list[str]:
    lines = [
        "| draft | resident bytes | × bf16 | held-out ppl | greedy agreement | α T=0 | α T=1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, x in q["rows"].items():
        lines.append(
            f"| {label} | {x['resident_bytes']:,} | {x['bytes_vs_bf16']:.3f} | {x['ppl']:.2f} | "
            f"{x['greedy_agreement']:.3f} | {x['alpha_t0']:.3f} | {x['alpha_t1']:.3f} |"
        )
    return lines


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


def _headline_md(r: dict[str, Any]) -> list[str]:
    middle = []
    if "roofline_fraction" in r:
        rf = r["roofline_fraction"]
        middle.append(
            f"| `roofline_fraction` | {rf['batch1']:.2f} / {rf['batch32']:.2f} | the verify "
            "step's achieved share of the bound, batch 1 / batch 32 |"
        )
    return headline_md(HEADLINE, r, middle)


# Sections that tools outside the suite write (one run of theirs each) and the report keeps:
# each tool writes bench/<name>.md; `splice_section` puts it in BENCHMARKS.md between markers
# naming the tool, and `markdown` carries those files over when the suite rewrites the report.
TOOL_SECTIONS = {
    "target": "tools/bench_target.py",
    "adaptive": "tools/bench_adaptive.py",
    "fleet": "tools/bench_fleet.py",
    "quant": "tools/quant_table.py",
    "openai": "tools/bench_openai.py",
}


def _markers(name: str) -> tuple[str, str]:
    tool = TOOL_SECTIONS[name]
    return f"<!-- begin: written by {tool}, rerun it to update -->", f"<!-- end: {tool} -->"


def _block(name: str, md: str) -> str:
    begin, end = _markers(name)
    return f"{begin}\n{md.rstrip()}\n{end}\n"


def splice_section(path: pathlib.Path, md: str, name: str = "target") -> None:
    """Put (or replace) tool section `name` (a key of `TOOL_SECTIONS`) in the report at
    `path`: in place if it is there, else before "## Reproduce", else at the end."""
    begin, end = _markers(name)
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + _block(name, md) + ("\n" + tail if tail else "")
    elif "\n## Reproduce" in text:
        head, tail = text.split("\n## Reproduce", 1)
        text = head.rstrip("\n") + "\n\n" + _block(name, md) + "\n## Reproduce" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + _block(name, md)
    path.write_text(text)


def write_tool_section(
    out: pathlib.Path, name: str, result: dict[str, Any], md: str
) -> pathlib.Path:
    """A tool's run into `out`: bench/<name>.json and bench/<name>.md, and its section of
    out/BENCHMARKS.md (`splice_section`); returns out/bench."""
    bench = out / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    (bench / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (bench / f"{name}.md").write_text(md)
    splice_section(out / "BENCHMARKS.md", md, name)
    return bench


def tool_sections(bench: pathlib.Path) -> dict[str, str]:
    """The tool-written sections present in `bench/` (name -> markdown)."""
    files = {n: bench / f"{n}.md" for n in TOOL_SECTIONS}
    return {n: f.read_text() for n, f in files.items() if f.is_file()}


def markdown(r: dict[str, Any], plots: dict[str, str], extra: dict[str, str] | None = None) -> str:
    """The whole report (`extra`: tool-written sections to carry over, see `splice_section`)."""
    s, p = r["sections"], r["profile_settings"]
    mdl = r["models"]

    def img(key: str, alt: str) -> list[str]:
        return ["", f"![{alt}]({plots[key]})"] if key in plots else []

    lines = [
        f"Produced by `{r['command']}` (profile `{r['profile']}`, {r['wall_time_s'] / 60:.1f} min) "
        f"on {machine_line(r)}. Every number below was measured in that one run; speeds are "
        "compared only as ratios within it. Target: "
        f"`{mdl['target']}` ({mdl['target_params']:,} parameters), draft: `{mdl['draft']}` "
        f"({mdl['draft_params']:,}); prompts are windows of {p['prompt_len']} tokens from the "
        "documents held out of the pair's training. Machine-readable: `bench/results.json`.",
    ]
    if r["profile"] != "full":
        lines += [
            "",
            f"**This is the `{r['profile']}` profile: tiny sizes that keep the code running, not "
            "measurements to quote.**",
        ]
    if r["failures"]:
        lines += ["", "## FAILED", ""]
        lines += [f"- {k}: {v}" for k, v in r["failures"].items()]
    if r["skipped"]:
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    lines += ["", "## Headline numbers", "", *_headline_md(r)]
    notes = behind(r)
    if notes:
        lines += ["", "## Where we are behind", ""] + [f"- {n}" for n in notes]
    if "colocated" in s:
        c = s["colocated"]
        lines += [
            "",
            "## 1. Co-located speculative vs plain decoding",
            "",
            f"Batch 1, {p['prompts']} prompt(s) one at a time, {p['new_tokens']} new tokens "
            "each, no stop token; plain and speculative timed in the same run (best of "
            f"{p['repeats']} after a warm-up). Greedy outputs are asserted identical to plain "
            "decoding. α = accepted / drafted (vLLM's definition). Self-speculation drafts with "
            f"the target itself at W4A16, group 128 ({c['self_draft_bytes']:,} bytes resident).",
            "",
            *_colocated_md(c),
            *img("colocated", "co-located speedup"),
        ]
    if "peer" in s:
        pr = s["peer"]
        lines += [
            "",
            "## 2. Peer: Hugging Face transformers on the same checkpoints",
            "",
            f"transformers {pr['transformers']}, torch {pr['torch']} (CPU, "
            f"{pr['torch_threads']} threads, float32 — our models load as float32 too); batch 1 "
            "(transformers' assisted generation takes one sequence), greedy, "
            f"{pr['prompts']} prompt(s), {pr['new_tokens']} new tokens in all, default stop "
            "tokens. **All five decoders produced identical tokens on every prompt "
            f"(asserted).** Timed in turns, the best of {pr['repeats']} after a warm-up.",
            "",
            *peer_md(pr),
            "",
            f"Ours ÷ theirs: plain **{ratio(pr['peer_plain_ratio'])}**, speculative "
            f"**{ratio(pr['peer_spec_ratio'])}** (against the faster of transformers' two "
            f"assisted settings). Speculative ÷ plain: ours {ratio(pr['ours_spec_speedup'])}, "
            f"transformers {ratio(pr['hf_assisted_speedup'])}.",
            *img("peer", "peer tokens/s"),
        ]
    if "capacity" in s:
        c = s["capacity"]
        lines += [
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
            *capacity_md(c),
            *_capacity_feasible(c, s.get("latency")),
            *img("capacity", "capacity"),
        ]
    if "latency" in s or "verifier" in s:
        lines += ["", "## 4. Latency vs RTT, and the verifier's batch sweep"]
    if "latency" in s:
        lat = s["latency"]
        lines += [
            "",
            "### RTT sweep",
            "",
            f"Greedy, γ = {lat['gamma']}, {lat['new_tokens']} tokens, one prompt. The edge "
            "drafter and `verify.LocalVerifier` run in this process behind "
            "`edge.delayed.DelayedEndpoint` (RTT/2 each way); pipelined depth covers the "
            "round trip "
            "(capped at 8). Predictions: the papers' model (`jaxspec.analytic`, "
            "held equal to `proofs/latency.py`) at the measured t_d, t_v, α. Cloud AR and "
            "co-located decoding stream what the cloud computes, so their time per token is "
            "their compute time.",
            "",
            latency.table_md(lat["components"], lat["rows"], lat["gamma"]).rstrip(),
            "",
            _latency_note(lat),
            *img("rtt", "time per token vs RTT"),
        ]
    if "verifier" in s:
        lines += [
            "",
            "### Batch sweep of the verify step",
            "",
            "B sessions verified in one step (random one-hot blocks); the roofline bound is "
            "max(weight bytes ÷ read bandwidth, FLOPs ÷ matmul throughput), and "
            "*roofline predicts* is the tokens/s ratio to batch 1 that bound allows.",
            "",
            *verifier_md(s["verifier"]),
            "",
            _verifier_note(s["verifier"]["rows"]),
            *img("batch", "batch sweep"),
        ]
    if "wirecost" in s:
        w = s["wirecost"]
        lines += [
            "",
            "## 5. Wire cost of the draft encodings",
            "",
            f"Sampled (T = {w['rows'][0]['temperature']:g}), sync, γ = {w['gamma']}, "
            f"{w['new_tokens']} tokens per session, one session per prompt, the same seeds for "
            "every encoding. Bytes are the protobuf messages of the gRPC service "
            "(`jaxspec.wire.block_to_proto` / `result_to_proto`, `ByteSize()`) for every block "
            "sent up and result sent down in real edge sessions (`edge.run_session` against "
            "`verify.LocalVerifier`), per committed token; HTTP/2 framing and TLS come on top.",
            "",
            *wire_md(w),
            "",
            *_wire_note(w["rows"]),
            *img("wire", "bytes per token vs alpha"),
        ]
    if "quality" in s:
        q = s["quality"]
        lines += [
            "",
            "## W4A16 draft quality",
            "",
            f"The draft unquantized (float32 as loaded) and at W4A16 (group 128): "
            f"perplexity on {q['windows']} windows of {q['seq_len']} held-out tokens, greedy "
            "agreement with the target there, α of co-located decoding (γ = 4) on "
            f"{q['prompts']} held-out prompts × {q['new_tokens']} tokens. Ratios W4A16 ÷ "
            f"unquantized: bytes (vs bf16) **{q['w4a16_bytes_ratio']:.3f}**, perplexity "
            f"**{q['w4a16_ppl_ratio']:.3f}**, α at T=1 **{q['w4a16_alpha_ratio']:.3f}** "
            f"(T=0: {q['w4a16_alpha_ratio_t0']:.3f}). `tools/quality_w4a16.py` has the full "
            "variant table.",
            "",
            *_quality_md(q),
        ]
    if "real" in r:
        # The real pair heads the report; the tiny pair's sections nest one level down.
        tiny = [("#" + ln) if ln.startswith("##") else ln for ln in lines]
        lines = [
            "# Benchmarks",
            "",
            "Two pairs: the real one (SmolLM2-135M-Instruct and its own W4A16 copy), then "
            "the tiny pair trained here, which runs in seconds and keeps every section honest.",
            "",
            *real_report.markdown(r["real"]),
            "",
            "## The tiny pair (5.4M parameters, trained here)",
            "",
            *tiny,
        ]
    else:
        lines = ["# Benchmarks", "", *lines]
    for name, md in (extra or {}).items():
        lines += ["", _block(name, md).rstrip("\n")]
    lines += [
        "",
        "## Reproduce",
        "",
        "```bash",
        "pip install -e .[test]   # torch (the peer) and matplotlib (the plots)",
        r["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def plots(r: dict[str, Any], bench: pathlib.Path) -> dict[str, str]:
    """Write one PNG per section that has data; returns key -> path relative to the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, out = r["sections"], {}

    def save(fig: Any, key: str) -> None:
        fig.tight_layout()
        fig.savefig(bench / f"{key}.png", dpi=100)
        plt.close(fig)
        out[key] = f"bench/{key}.png"

    if "colocated" in s:
        fig, ax = plt.subplots(figsize=(10, 4))
        rows = [("pair", x) for x in s["colocated"]["default_pair"]]
        rows += [("self", x) for x in s["colocated"]["self_w4a16"]]
        labels = [f"T={x['temperature']:g}\nγ{x['gamma']}\n{x['mode'][:4]}" for _, x in rows]
        colors = ["C0" if k == "pair" else "C1" for k, _ in rows]
        ax.bar(range(len(rows)), [x["speedup"] for _, x in rows], color=colors)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_ylabel("speculative ÷ plain tokens/s")
        ax.set_title("co-located speculative decoding (blue: draft model, orange: self W4A16)")
        save(fig, "colocated")
    if "peer" in s:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        t = s["peer"]["tok_s"]
        names = list(t)
        ax.barh(names, [t[k] for k in names], color=["C1" if "hf" in k else "C0" for k in names])
        ax.set_xlabel("tokens/s (greedy, batch 1, identical tokens)")
        ax.set_title("jaxspec (blue) vs transformers (orange)")
        save(fig, "peer")
    if "capacity" in s and "method" in s["capacity"]:  # (not a pre-bisection report's)
        c = s["capacity"]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m, color in zip(
            ("cloud_ar", "colocated", "edge_cloud"), ("C0", "C1", "C2"), strict=True
        ):
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
        save(fig, "capacity")
    if "latency" in s:
        latency.plot(s["latency"]["rows"], bench / "rtt.png")
        out["rtt"] = "bench/rtt.png"
    if "verifier" in s:
        rows = s["verifier"]["rows"]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        b = [x["batch"] for x in rows]
        ax.plot(b, [x["ratio_to_batch1"] for x in rows], "o", label="measured")
        ax.plot(b, [x["roofline_ratio_to_batch1"] for x in rows], "-", label="roofline bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sessions per verify step")
        ax.set_ylabel("verified tokens/s ÷ batch 1")
        ax.legend()
        save(fig, "batch")
    if "wirecost" in s:
        rows = s["wirecost"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for x in rows:
            ax.plot(x["bytes_per_token"], x["alpha"], "o")
            ax.annotate(x["encoding"], (x["bytes_per_token"], x["alpha"]), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("wire bytes per committed token (up + down)")
        ax.set_ylabel("α")
        ax.set_title("bandwidth vs acceptance per draft encoding")
        save(fig, "wire")
    return out
