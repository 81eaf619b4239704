"""What the report's templates share: the `Page` a section's part reads, ratios, the headline
table, the machine line, and writing a plot."""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Page:
    """What a section's markdown reads besides its own results: the whole pass (`results`:
    settings, models, the other sections) and the plots drawn (key -> path)."""

    results: dict[str, Any]
    plots: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def sections(self) -> dict[str, Any]:
        return self.results["sections"]

    @property
    def settings(self) -> dict[str, Any]:
        return self.results["profile_settings"]

    def img(self, key: str, alt: str) -> list[str]:
        """The plot `key`'s image line (after a blank line), if it was drawn."""
        return ["", f"![{alt}]({self.plots[key]})"] if key in self.plots else []


def part(heading: str, *paragraphs: str | Sequence[str]) -> list[str]:
    """A part of the report: a blank line and `heading`, then each paragraph after a blank
    line (a string is one line; a list is its lines, a table's say)."""
    lines = ["", heading]
    for paragraph in paragraphs:
        lines += ["", *([paragraph] if isinstance(paragraph, str) else paragraph)]
    return lines


def _template(name: str) -> str:
    """The text of render/prose/<name>.md (package data)."""
    return (importlib.resources.files(__package__) / "prose" / f"{name}.md").read_text()


def prose(name: str, **fields: Any) -> str:
    """The paragraph `name` of the report, its `{fields}` filled: the text of
    render/prose/<name>.md (wrapped there for reading; one line in the report)."""
    return " ".join(_template(name).split()).format(**fields)


def labels(name: str) -> list[tuple[str, str]]:
    """The (key, description) rows of render/prose/<name>.md, one `key: description` a line:
    which results a headline table shows, in order, and what each means."""
    lines = _template(name).splitlines()
    return [tuple(line.split(": ", 1)) for line in lines if line.strip()]


def columns(name: str, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The table `name` (render/prose/<name>.md: its header line, its alignment line and one
    row's template), a row per mapping of `rows`."""
    head, align, row = _template(name).strip().split("\n")
    return table(head, align, (row.format(**r) for r in rows))


def table(head: str, align: str, rows: Iterable[str]) -> list[str]:
    """A markdown table: its header line, its alignment line, then `rows`."""
    return [head, align, *rows]


# Where an edge session's time goes (`SessionTrace.stalls`): key -> column heading.
STALLS = (("draft_kept", "drafting, kept"), ("draft_wasted", "drafting, thrown away"),
          ("wait_step", "waiting: verifier's step"), ("wait_wire", "waiting: wire and hops"),
          ("wait_stale", "waiting: stale answers"), ("host", "host"))  # fmt: skip


def stalls_table(head: str, align: str, rows: Iterable[tuple[str, dict[str, float]]]) -> list[str]:
    """A table of edge sessions' stalls: each row's leading cells (`head`, `align` for them),
    then each of `STALLS` as a share of the session's time."""
    return table(
        head + " | ".join(h for _, h in STALLS) + " |",
        align + "---:|" * len(STALLS),
        (lead + " | ".join(f"{100 * s[k]:.0f}%" for k, _ in STALLS) + " |" for lead, s in rows),
    )


def ratio(v: float) -> str:
    """`v` as a ratio: 1.23×."""
    return f"{v:.2f}×"


def headline_md(
    keys: list[tuple[str, str]], r: dict[str, Any], middle: list[str] = ()
) -> list[str]:
    """The headline table: one row per scalar key of `keys` that `r` holds, then the rows
    `middle` (a pair's own composite keys), then the wire bytes per encoding."""
    lines = ["| key | value | meaning |", "|---|---:|---|"]
    lines += [f"| `{k}` | {r[k]:.3f} | {meaning} |" for k, meaning in keys if k in r]
    lines += list(middle)
    if "wire_bytes_per_token" in r:
        wb = ", ".join(f"{k} {v:,.0f}" for k, v in r["wire_bytes_per_token"].items())
        lines.append(f"| `wire_bytes_per_token` | {wb} | per encoding, up + down |")
    return lines


def machine_line(r: dict[str, Any]) -> str:
    """The machine a pass ran on, in one line."""
    m = r["machine"]
    extra = ", ".join(f"{k} {m[k]}" for k in ("torch", "transformers") if k in m)
    return (
        f"{m['cores']} CPU cores ({m['processor']}), {m['memory_gib']} GiB memory, "
        f"jax {m['jax']} ({m['jax_backend']}), Python {m['python']}"
        + (f", {extra}" if extra else "")
        + f"; {m['platform']}; 1-minute load average {m['load_average_1min_start']:.1f} at the "
        f"start and {m['load_average_1min_end']:.1f} at the end (its own threads count)"
    )


def save(fig: Any, bench: Any, key: str) -> dict[str, str]:
    """Write `fig` as bench/<key>.png (and close it); {key: its path from the report}."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(bench / f"{key}.png", dpi=100)
    plt.close(fig)
    return {key: f"bench/{key}.png"}
