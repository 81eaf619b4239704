"""The `peer` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, prose, ratio, save, table


def table_md(pr: dict[str, Any]) -> list[str]:
    """Tokens/s of the five decoders, against transformers' plain greedy."""
    names = {
        "hf_plain": "transformers `generate` (plain greedy)",
        "hf_assisted": "transformers assisted generation (default dynamic draft length)",
        "hf_assisted_const": f"transformers assisted generation (constant {pr['gamma']} drafts)",
        "ours_plain": "jaxspec `generate` (plain greedy)",
        "ours_spec": f"jaxspec `generate(draft=…, gamma={pr['gamma']})` (sync)",
    }
    t = pr["tok_s"]
    return table(
        "| decoder | tokens/s | vs transformers plain |",
        "|---|---:|---:|",
        (f"| {label} | {t[k]:.0f} | {ratio(t[k] / t['hf_plain'])} |" for k, label in names.items()),
    )


def markdown_tiny(pr: dict[str, Any], page: Page) -> list[str]:
    """Section 2 of the tiny pair's report."""
    return [
        *part(
            "## 2. Peer: Hugging Face transformers on the same checkpoints",
            prose("peer", **pr),
            table_md(pr),
            f"Ours ÷ theirs: plain **{ratio(pr['peer_plain_ratio'])}**, speculative "
            f"**{ratio(pr['peer_spec_ratio'])}** (against the faster of transformers' two "
            f"assisted settings). {_spec_over_plain(pr)}",
        ),
        *page.img("peer", "peer tokens/s"),
    ]


def markdown_real(pr: dict[str, Any], page: Page) -> list[str]:
    """The real pair's peer table (its draft dequantized for transformers)."""
    return part(
        "### Peer: transformers on the same pair",
        f"transformers {pr['transformers']}, torch {pr['torch']} ({pr['torch_threads']} "
        "threads, float32); the draft given to transformers is ours dequantized to float32 "
        "(`jaxspec.quant.quantize.dequantize`: same weights, float matmuls). Greedy, batch 1, "
        f"{pr['prompts']} prompts, {pr['new_tokens']} new tokens in all, default stop "
        "tokens; **all five decoders gave identical tokens (asserted)**.",
        table_md(pr),
        f"Ours ÷ theirs: plain **{ratio(pr['peer_plain_ratio'])}**, speculative "
        f"**{ratio(pr['peer_spec_ratio'])}**. {_spec_over_plain(pr)}",
    )


def _spec_over_plain(pr: dict[str, Any]) -> str:
    return (
        f"Speculative ÷ plain: ours {ratio(pr['ours_spec_speedup'])}, "
        f"transformers {ratio(pr['hf_assisted_speedup'])}."
    )


def plot(pr: dict[str, Any], bench: Any) -> dict[str, str]:
    """Tokens/s of each decoder, ours and transformers'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    t = pr["tok_s"]
    names = list(t)
    ax.barh(names, [t[k] for k in names], color=["C1" if "hf" in k else "C0" for k in names])
    ax.set_xlabel("tokens/s (greedy, batch 1, identical tokens)")
    ax.set_title("jaxspec (blue) vs transformers (orange)")
    return save(fig, bench, "peer")
