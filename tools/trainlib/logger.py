"""The training tools' log: time-stamped lines and a rich progress bar (off without a
terminal or with `--no-progress`)."""

from __future__ import annotations

import time
from typing import Any


class Logger:
    def __init__(self, progress: bool):
        from rich.console import Console

        self.console = Console(stderr=False, highlight=False)
        self.progress_enabled = progress and self.console.is_terminal
        self.t0 = time.time()

    def log(self, msg: str) -> None:
        self.console.print(f"[{time.time() - self.t0:7.1f}s] {msg}", markup=False, soft_wrap=True)

    def progress(self) -> Any:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            disable=not self.progress_enabled,
        )
