"""The `specbench` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, ratio


def table_md(sb: dict[str, Any]) -> list[str]:
    """One row per category and one over all, with the acceptance at each position; where
    the run had `gamma="auto"`, its speedup and the gammas it picked beside the fixed one's."""
    g, auto = sb["gamma"], sb.get("auto")
    extra = " γ auto: speedup | picked |" if auto else ""
    lines = [
        "| category | prompts | plain tok/s | SD tok/s | speedup | tokens per round | α | "
        + " | ".join(f"pos {i + 1}" for i in range(g))
        + " |"
        + extra,
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * g + "---:|---|" * bool(auto),
    ]
    autos = [*auto["rows"], auto["overall"]] if auto else []
    for i, row in enumerate([*sb["rows"], sb["overall"]]):
        name = f"**{row['category']}**" if row["category"] == "overall" else row["category"]
        pos = " | ".join(f"{a:.2f}" for a in row["per_position_acceptance"])
        line = (
            f"| {name} | {row['prompts']} | {row['plain_tok_s']:.1f} | {row['spec_tok_s']:.1f} | "
            f"{ratio(row['speedup'])} | {row['tokens_per_round']:.2f} | {row['alpha']:.3f} | "
            f"{pos} |"
        )
        if autos:
            a = autos[i]
            picked = ", ".join(str(x) for x in sorted(set(a["gammas"])))
            line += f" {ratio(a['speedup'])} | {picked} |"
        lines.append(line)
    return lines


def markdown(sb: dict[str, Any], page: Page) -> list[str]:
    """The Spec-Bench section of the real pair's report."""
    auto = (
        ' The last two columns: the same prompts at `gamma="auto"` (timed the same way; its '
        "forwards measured once per process inside a jitted loop, the acceptance read from "
        "the pair's earlier calls: `jaxspec.decoding.generate.choose_gamma`) and the gammas "
        "it picked."
        if "auto" in sb
        else ""
    )
    return [
        "",
        "### Spec-Bench: speedup and mean accepted tokens per category (T = 0, batch 1)",
        "",
        f"γ = {sb['gamma']}, sync, {sb['new_tokens']} new tokens per prompt (stop tokens "
        f"ignored so every answer has that length), plain and speculative timed in turns "
        f"(the best of {page.settings['repeats']} after a warm-up). Greedy speculative "
        "tokens are asserted equal to plain greedy tokens. Tokens per round = tokens "
        "committed per verification (bonus included; Spec-Bench's τ); pos i = the share "
        f"of rounds whose draft i was accepted.{auto}",
        "",
        *table_md(sb),
    ]
