"""The `wirecost` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, columns, part, prose, save


def table_md(w: dict[str, Any]) -> list[str]:
    """Bytes per committed token, alpha and tokens per round by encoding."""
    return columns("wirecost_table", w["rows"])


def note(rows: list[dict[str, Any]]) -> list[str]:
    """What alpha means here, and what `full` buys over the cheapest encoding."""
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


def markdown_tiny(w: dict[str, Any], page: Page) -> list[str]:
    """Section 5 of the tiny pair's report."""
    return [
        *part(
            "## 5. Wire cost of the draft encodings",
            prose("wirecost", temperature=w["rows"][0]["temperature"], **w),
            table_md(w),
            note(w["rows"]),
        ),
        *page.img("wire", "bytes per token vs alpha"),
    ]


def markdown_real(w: dict[str, Any], page: Page) -> list[str]:
    """The real pair's table, at its vocabulary."""
    return part(
        f"### Wire bytes per token at a {page.results['models']['vocab_size']:,}-entry vocabulary",
        f"Sampled (T = {w['rows'][0]['temperature']:g}), sync, γ = {w['gamma']}, "
        f"{w['new_tokens']} tokens per session; protobuf bytes up and down per committed "
        "token.",
        table_md(w),
    )


def plot(w: dict[str, Any], bench: Any) -> dict[str, str]:
    """Alpha against bytes per token, one point per encoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for x in w["rows"]:
        ax.plot(x["bytes_per_token"], x["alpha"], "o")
        ax.annotate(x["encoding"], (x["bytes_per_token"], x["alpha"]), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("wire bytes per committed token (up + down)")
    ax.set_ylabel("α")
    ax.set_title("bandwidth vs acceptance per draft encoding")
    return save(fig, bench, "wire")
