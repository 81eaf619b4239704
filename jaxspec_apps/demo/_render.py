"""Drawing the demo with rich: the live dashboard and the plain summary.

    jaxspec demo · running · 12.3 s · pipelined γ=4 depth 2 · RTT 50±5 ms · T=0.7
    ╭─ cloud verifier 127.0.0.1:40123 (spawned, pid 4242) ─────────────────────╮
    │ verifier-wide: 3 sessions · queue 1 · step 7.1 ms · 512 steps since start │
    │ this demo: 1536 tokens · █▍░░ 1.1 rows/step · 147 tok/s ▁▂▄▆█▇▆▅▆▇▇▆▅▆▇█  │
    ╰───────────────────────────────────────────────────────────────────────────╯
    ╭─ edge 1 · α 0.81 · 63 tok/s · ITL 16 ms · 87/160 ────────────────────────╮
    │ def fibonacci(n):            (the last lines of the text that fit)        │
    ╰───────────────────────────────────────────────────────────────────────────╯
    ■ prompt  ■ accepted  ■ correction  ■ bonus  ■ rejected  ■ in flight

The dashboard sizes itself to the console (one line short of its height, so a live region
never scrolls): tenant panels stack, go side by side on wide terminals, and shrink to two
lines, then one line, per tenant when there are more tenants than fit.

The verifier may be shared (`--verifier`): what is this demo's own (its tenants' tokens and
rates) and what is verifier-wide (sessions, queue, steps of every client) are labelled apart,
and the verifier's lifetime counters are shown from the moment the tenants started.
"""

from __future__ import annotations

import io
import math
import time
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.layout import Layout
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from jaxspec_apps.demo._state import (
    ACCEPT,
    BONUS,
    CORRECT,
    PROMPT,
    REJECT,
    SEPARATOR,
    DemoState,
    TenantView,
)

STYLES = {
    PROMPT: "bold",
    ACCEPT: "green",
    CORRECT: "bold yellow",
    BONUS: "bold cyan",
    REJECT: "red strike",
    SEPARATOR: "dim",
    "inflight": "dim italic",
}
LEGEND = (
    (PROMPT, "prompt"),
    (ACCEPT, "accepted"),
    (CORRECT, "correction"),
    (BONUS, "bonus"),
    (REJECT, "rejected"),
    ("inflight", "in flight"),
)
SPARKS = "▁▂▃▄▅▆▇█"
MIN_PANEL_WIDTH = 60  # a tenant panel narrower than this is hard to read
BLANK = Text(" ")  # not Text(""): an empty (falsy) renderable makes Layout draw a placeholder


def sparkline(values: list[float], width: int) -> str:
    """The last `width` values as block characters scaled to their maximum."""
    vals = list(values)[-width:] if width > 0 else []
    top = max(vals, default=0.0)
    if top <= 0:
        return SPARKS[0] * len(vals)
    top_i = len(SPARKS) - 1
    return "".join(SPARKS[min(top_i, max(0, round(v / top * top_i)))] for v in vals)


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of `width` cells, eighths resolution."""
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    return ("█" * full + partial).ljust(width, "░")


FINISHED = ("done", "stopped", "error")
REJECTED_LINE = 60  # characters of the latest rejected drafts under a finished tenant's text


def rejected_line(view: TenantView, width: int = REJECTED_LINE) -> str:
    """`rejected drafts (12): …ind ¦ 00 ¦ call ¦ rome`: the latest ones, cut at the left."""
    drafts = [p.replace("\n", "⏎") for k, p in view.pieces if k == REJECT]
    line = " ¦ ".join(d.strip() or repr(d) for d in drafts)
    if len(line) > width:
        line = "…" + line[-(width - 1) :]
    return f"rejected drafts ({len(drafts)}): {line}"


def tenant_text(view: TenantView) -> Text:
    """The tenant's text with every piece in its style, drafts in flight at the end.

    While it runs, rejected drafts stand (struck through) where they were proposed; once it
    has finished only the committed text is shown, the rejected drafts apart on a line of
    their own, so the final screen reads without strikethrough."""
    text = Text(overflow="fold")
    final = view.status in FINISHED
    for kind, piece in view.pieces:
        if not (final and kind == REJECT):
            text.append(piece, STYLES[kind])
    for _, piece in view.inflight:
        text.append(piece, STYLES["inflight"])
    if view.status == "drafting" and view.tokens == 0:
        text.append("  (waiting for the first verified block…)", "dim")
    if final and view.rejections:
        text.append("\n" + rejected_line(view), "dim red")
    if view.status == "error":
        text.append(f"\n{view.error}", "bold red")
    return text


def tenant_title(view: TenantView, now: float) -> Text:
    """`edge 1 · α 0.81 · 63 tok/s · ITL 16 ms · 87/160 · TTFT 41.2 s` (live rate while it
    runs; TTFT from the command's start)."""
    running = view.status == "drafting"
    rate = view.recent_tokens_per_s(now) if running else view.tokens_per_s
    itl = view.inter_token_latency_s
    t = Text.assemble(
        (f" edge {view.index + 1}", "bold"),
        f" · α {view.figures.acceptance_rate:.2f}",
        f" · {rate:.0f} tok/s",
        f" · ITL {itl * 1e3:.0f} ms" if itl else " · ITL –",
        f" · {view.new_tokens}/{view.max_new_tokens}",
    )
    if view.first_token_s is not None:  # from the command's start, as the header's time
        t.append(f" · TTFT {view.first_token_s:.1f} s")
    if view.sample > 1:
        t.append(f" · #{view.sample}")
    if view.status not in ("drafting", "waiting"):
        t.append(f" · {view.status}", "bold red" if view.status == "error" else "dim")
    t.append(" ")
    return t


class Tail:
    """The last lines of a renderable that fit the height it is given (a text that grows at
    the bottom stays visible at the bottom)."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = options.height
        lines = console.render_lines(self.renderable, options.update(height=None), pad=False)
        if height is not None:
            lines = lines[-height:] if height > 0 else []
        for i, line in enumerate(lines):
            if i:
                yield Segment.line()
            yield from line


class Fixed:
    """A renderable cut or padded to exactly `height` lines."""

    def __init__(self, renderable: Any, height: int) -> None:
        self.renderable, self.height = renderable, height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        opts = options.update(height=self.height)
        lines = console.render_lines(self.renderable, opts, pad=True)
        for i, line in enumerate(lines):
            if i:
                yield Segment.line()
            yield from line


class _Spark:
    """A sparkline that fills whatever width its cell has."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(sparkline(self.values, options.max_width), "magenta", no_wrap=True)


def header(state: DemoState, now: float) -> Text:
    """`jaxspec demo · running · 12.3 s · pipelined γ=4 depth 2 · RTT 50±5 ms · T=0.8`."""
    s = state.settings
    mode = f"{s.mode} γ={s.gamma}" + (f" depth {s.depth}" if s.mode == "pipelined" else "")
    rtt = f"RTT {s.rtt_ms:g}±{s.jitter_ms:g} ms" if s.jitter_ms else f"RTT {s.rtt_ms:g} ms"
    colour = {"running": "green", "done": "green", "interrupted": "yellow"}.get(state.phase)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("jaxspec demo", "bold magenta")
    t.append(" · ")
    t.append(state.phase, f"bold {colour}" if colour else "bold")
    t.append(f" · {state.elapsed_s(now):.1f} s · {mode} · {rtt} · T={s.temperature:g}")
    return t


def verifier_panel(state: DemoState) -> Panel:
    """Verifier-wide: sessions, queue, step time, steps since the tenants started; this
    demo's own: tokens, rows per verifier step and the throughput line."""
    s, st = state.settings, state.stats
    where = "spawned" + (f", pid {s.verifier_pid}" if s.verifier_pid else "")
    title = f" cloud verifier {s.verifier or '…'} ({where if s.spawned else 'remote'}) "
    rate = state.throughput[-1] if state.throughput else 0.0
    rows = state.rows_per_step
    if st:
        steps = state.since_start("steps")
        note = ""
        if not st.get("serving", True):
            note = " · draining"
        elif state.stalled_s >= 1.0:  # blocks wait, no step: a new batch shape compiles
            note = f" · compiling a new batch shape ({state.stalled_s:.0f} s)"
        line1 = Text(
            f"verifier-wide: {st.get('sessions', 0)} sessions · queue "
            f"{st.get('queued_blocks', 0)} · step {st.get('last_step_s', 0.0) * 1e3:.1f} ms · "
            f"{steps} steps since start{note}",
            no_wrap=True,
            overflow="ellipsis",
        )
        slots = max(1, s.tenants)
        left = Text.assemble(
            f"this demo: {state.total_tokens()} tokens · ",
            (bar((rows or 0.0) / slots, 4), "green"),
            f" {rows:.1f} rows/step · " if rows is not None else " – rows/step · ",
            (f"{rate:.0f} tok/s ", "bold"),
        )
    else:
        line1 = Text(state.stats_error or state.detail or "waiting for its figures…", "dim")
        line1.no_wrap, line1.overflow = True, "ellipsis"
        left = Text.assemble(
            f"this demo: {state.total_tokens()} tokens · ", (f"{rate:.0f} tok/s ", "bold")
        )
    line2 = Table.grid(expand=True)
    line2.add_column(no_wrap=True)
    line2.add_column(ratio=1, no_wrap=True)
    line2.add_row(left, _Spark(list(state.throughput)))
    return Panel(Group(line1, line2), title=title, title_align="left", box=box.ROUNDED)


def legend() -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    for kind, name in LEGEND:
        t.append("■ ", STYLES[kind].replace("strike", "").strip())
        t.append(name, STYLES[kind])
        t.append("  ")
    return t


def tenant_panel(view: TenantView, now: float) -> Panel:
    border = {"error": "red", "done": "green", "stopped": "yellow"}.get(view.status, "blue")
    return Panel(
        Tail(tenant_text(view)),
        title=tenant_title(view, now),
        title_align="left",
        border_style=border,
        box=box.ROUNDED,
        padding=(0, 1),
    )


class _LastLine:
    """The end of a text on one line, newlines shown as ⏎, cut at the left to fit."""

    def __init__(self, text: Text) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        flat = self.text.copy()
        flat.plain = flat.plain.replace("\n", "⏎")  # same length: the spans still fit
        width = options.max_width
        if flat.cell_len > width:
            flat = Text("…", "dim") + flat[-(width - 1) :] if width > 1 else Text("…")
        flat.no_wrap = True
        yield flat


def compact_tenants(views: list[TenantView], now: float, height: int) -> Table:
    """One line per tenant (figures + the end of its text), for crowded screens."""
    table = Table.grid(expand=True, padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(ratio=1, no_wrap=True)
    shown = views if len(views) <= height else views[: max(0, height - 1)]
    for v in shown:
        table.add_row(tenant_title(v, now), _LastLine(tenant_text(v)))
    if len(shown) < len(views):
        table.add_row(Text(f" … and {len(views) - len(shown)} more tenants", "dim"), "")
    return table


def two_line_tenants(views: list[TenantView], now: float, height: int) -> Table:
    """Per tenant its title and the last line of its text (when panels do not fit)."""
    table = Table.grid(expand=True)
    table.add_column(no_wrap=True)
    for v in views[: height // 2]:
        table.add_row(tenant_title(v, now))
        table.add_row(Fixed(Tail(tenant_text(v)), 1))
    return table


def tenants_layout(views: list[TenantView], now: float, width: int, height: int) -> Any:
    """Stacked panels, side by side on wide terminals (the fewest columns that give each
    panel 6 lines, else as many as fit); two lines or one line per tenant when crowded."""
    n = len(views)
    if n == 0 or height <= 0:
        return BLANK
    most = max(1, min(n, width // MIN_PANEL_WIDTH))
    cols = next((c for c in range(1, most + 1) if height // math.ceil(n / c) >= 6), most)
    rows = math.ceil(n / cols)
    if height // rows < 3:
        if height // n >= 2:
            return two_line_tenants(views, now, height)
        return compact_tenants(views, now, height)
    layout = Layout()
    row_layouts = []
    for r in range(rows):
        row = Layout()
        cells = [Layout(tenant_panel(v, now)) for v in views[r * cols : (r + 1) * cols]]
        cells += [Layout(BLANK) for _ in range(cols - len(cells))]
        row.split_row(*cells)
        row_layouts.append(row)
    layout.split_column(*row_layouts)
    return layout


class Dashboard:
    """The whole screen, redrawn from `state` on every refresh (rich's thread calls it)."""

    def __init__(self, state: DemoState, height: int | None = None) -> None:
        self.state = state
        self.height = height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = self.height or max(8, console.height - 1)
        width = options.max_width
        now = time.perf_counter()
        with self.state.lock:
            layout = Layout()
            parts = [Layout(header(self.state, now), size=1)]
            parts.append(Layout(verifier_panel(self.state), size=4))
            body = height - 6
            views = list(self.state.tenants)
            parts.append(Layout(tenants_layout(views, now, width, body), size=max(0, body)))
            parts.append(Layout(legend(), size=1))
            layout.split_column(*parts)
            yield Fixed(layout, height)


def answer_text(view: TenantView) -> str:
    """What a tenant committed after its prompt: accepted drafts, corrections and bonus
    tokens, never a rejected draft (samples of `--seconds` runs separated by a rule)."""
    return "".join(p for k, p in view.pieces if k not in (PROMPT, REJECT)).strip("\n")


def answers(state: DemoState) -> str:
    """The plain-text end of every run: per tenant its figures, question and answer.

    edge 1 · done · α 0.81 · 63.2 tok/s · 160 tokens
      Q: Write a Python function that checks whether a string is a palindrome.
      A: Here is a function ...
    """
    out = []
    with state.lock:
        for v in state.tenants:
            head = (
                f"edge {v.index + 1} · {v.status} · α {v.figures.acceptance_rate:.2f} · "
                f"{v.tokens_per_s:.1f} tok/s · {v.tokens} tokens"
            )
            q = v.prompt_text.strip().replace("\n", "\n     ")
            a = answer_text(v).replace("\n", "\n     ") or "(nothing committed)"
            out.append(f"{head}\n  Q: {q}\n  A: {a}")
            if v.error:
                out.append(f"  error: {v.error}")
    return "\n\n".join(out)


def timing_note(state: DemoState, now: float | None = None) -> str:
    """What the summary's times count from: `times from the command's start: verifier
    serving after 31.0 s, the run 367.2 s; TTFT s: the first token; sess s: ...`."""
    serving = f"verifier serving after {state.serving_s:.1f} s, " if state.serving_s else ""
    return (
        f"times from the command's start: {serving}the run {state.elapsed_s(now):.1f} s; "
        "TTFT s: the first token; sess s: the same from its session's opening"
    )


def summary(state: DemoState) -> Group:
    """The plain report: one row per tenant, the verifier's figures, then every tenant's
    question and committed answer (`answers`)."""
    s = state.settings
    table = Table(
        title=(
            f"jaxspec demo: {s.tenants} tenants, {s.mode} γ={s.gamma}, RTT {s.rtt_ms:g} ms, "
            f"T={s.temperature:g}, verifier {s.verifier or '?'}"
        ),
        box=box.SIMPLE,
        pad_edge=False,
        collapse_padding=True,  # 80 columns hold every column
    )
    names = ("tenant", "status", "tokens", "α", "tok/s", "ITL ms", "TTFT s", "sess s")
    for name in names:
        table.add_column(name, justify="left" if name in ("tenant", "status") else "right")
    table.add_column("rejected", justify="right")
    table.add_column("stale", justify="right")
    with state.lock:
        for v in state.tenants:
            ttft = f"{v.first_token_s:.2f}" if v.first_token_s is not None else "–"
            session_ttft = f"{v.ttft_s[0]:.2f}" if v.ttft_s else "–"
            table.add_row(
                f"edge {v.index + 1}",
                v.status,
                str(v.tokens),
                f"{v.figures.acceptance_rate:.2f}",
                f"{v.tokens_per_s:.1f}",
                f"{v.inter_token_latency_s * 1e3:.1f}",
                ttft,
                session_ttft,
                str(v.rejections),
                str(v.stale),
            )
        st = state.stats
        lines: list[Any] = [table, Text(timing_note(state))]
        lines.append(
            Text(
                f"this demo: {state.total_tokens()} tokens committed in "
                f"{state.total_rounds()} verified blocks"
            )
        )
        if st:
            lines.append(
                Text(
                    f"verifier-wide (every client): {state.since_start('steps')} steps and "
                    f"{state.since_start('tokens_committed')} tokens committed since this demo's "
                    f"tenants started, last step {st.get('last_step_s', 0.0) * 1e3:.1f} ms; "
                    f"lifetime {st.get('steps', 0)} steps, mean batch occupancy "
                    f"{st.get('mean_occupancy', 0.0):.2f}"
                )
            )
        lines.append(Text("\n" + answers(state)))
    return Group(*lines)


def save_capture(state: DemoState, path: str, width: int = 80, height: int = 24) -> None:
    """Write the screen as a `width` x `height` terminal would show it now: an SVG (rich's
    export, colours included) for a `.svg` path, plain text otherwise."""
    con = Console(file=io.StringIO(), width=width, height=height, record=True, force_terminal=True)
    con.print(Dashboard(state, height=height - 1))
    if path.endswith(".svg"):
        con.save_svg(path, title="jaxspec demo")
    else:
        con.save_text(path)
