"""Blocking work (loading a model, compiling its steps) off the event loop, in a thread that
never holds up the process's end.

`loop.run_in_executor(None, ...)` runs it in the default executor, whose threads both
`asyncio.run` (at its end: `shutdown_default_executor`) and the interpreter (at exit) wait
for. An XLA compilation cannot be interrupted, and one of SmolLM2's takes tens of seconds:
a Ctrl-C during start-up then took that long, or longer, to end the command. `in_thread`
runs the work in a daemon thread instead: the command ends at once and the thread is
abandoned with the process. Abandoned, not left to the interpreter: a daemon thread still
inside XLA when the interpreter finalizes aborts the process ("terminate called after
throwing an instance of ''", SIGABRT), so a command ends with `exit_if_abandoned(code)`,
which flushes what was printed and leaves with `os._exit` while a worker still runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_RUNNING: set[threading.Thread] = set()  # the workers that have not returned yet


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Give `fut` the thread's outcome (unless it was cancelled meanwhile)."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def in_thread(fn: Callable[..., T], *args: Any, name: str = "jaxspec-worker") -> asyncio.Future:
    """`fn(*args)` in a new daemon thread; the running loop's future of its result (or
    exception). Cancelling the future does not stop `fn`: it runs on, unwaited for."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def run() -> None:
        result, error = None, None
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine, not lost
            error = e
        finally:
            _RUNNING.discard(threading.current_thread())
        try:
            loop.call_soon_threadsafe(_settle, fut, result, error)
        except RuntimeError:  # the loop has closed: nobody waits for this any more
            pass

    thread = threading.Thread(target=run, name=name, daemon=True)
    _RUNNING.add(thread)
    thread.start()
    return fut


def abandoned() -> list[str]:
    """The names of the workers still running (none once every `in_thread` call returned)."""
    return sorted(t.name for t in list(_RUNNING) if t.is_alive())


def exit_if_abandoned(code: int, *, force: bool = False) -> int:
    """A command's last step: `code` back when no worker runs any more; else the output
    flushed and the process ended at once with `code` (`os._exit`: the interpreter's
    finalization would abort in the worker's XLA call, see the module's docstring). `force`:
    end that way even with no worker left (an interrupted command, whose half-run event
    loops would otherwise print "Exception ignored" tracebacks as the interpreter collects
    them)."""
    if not force and not abandoned():
        return code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say there
            pass
    os._exit(code)
