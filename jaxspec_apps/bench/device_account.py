"""Where a jitted program's device time goes: `jax.profiler`'s trace of one run, each XLA op's
time put under the part of the program it belongs to.

The trace (`jax.profiler.trace(..., create_perfetto_trace=True)`) names every op the CPU
runs by its instruction in the compiled HLO (`ffi_call.481`, `add_bitcast_fusion.12`,
`copy.3`); the compiled text gives each instruction its `op_name`, which carries the
`jax.named_scope`s it was traced under (`speculative_decode` names its round's parts:
`round_draft`, `round_target`, `round_rule`, `prefill_target`, `prefill_draft`). An op's
time is the time its thread spent in it (a loop's or a branch's span is not counted: the ops
inside it are); XLA's CPU runtime may run independent ops on both
threads at once, so the parts' times add up to the threads' busy time, which can exceed the
program's wall time (`device_wall_s`, the runtime's wait for completion).
"""

from __future__ import annotations

import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax

INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.-]+) = .*?op_name="([^"]*)"')
# Control flow: a loop's or a branch's event spans the ops it runs (counted on their own).
CONTAINER = re.compile(r"^(while|cond|conditional|call)\.\d")
WAIT = "ThunkExecutor::Execute (wait for completion)"


def op_names(compiled_text: str) -> dict[str, str]:
    """Instruction name -> its `op_name` (the scopes it was traced under)."""
    out = {}
    for line in compiled_text.splitlines():
        m = INSTRUCTION.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def traced(run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The complete events ("X") of one call of `run` under `jax.profiler`, each with its
    thread's name under "thread"."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            run()
        path = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)[0]
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    return [
        {**e, "thread": names.get((e["pid"], e["tid"]), "")} for e in events if e.get("ph") == "X"
    ]


def account(
    events: list[dict[str, Any]], names: dict[str, str], part: Callable[[str, str], str | None]
) -> dict[str, Any]:
    """Seconds per part over the XLA threads' events (`part(instruction, op_name)` names an
    op's part; None: not an op of the program, e.g. the executor's own spans) and the
    program's wall (`device_wall_s`). The host's threads are left out: their spans also hold
    the profiler's own start and stop, so the host's time is measured without the profiler
    (`roundprofile.colocated_account`)."""
    parts: dict[str, float] = {}
    wall = 0.0
    # The host's threads: those with Python frames ("$file:line name"; the main thread is
    # named after the process, "python" or "jaxspec").
    host = {(e["pid"], e["tid"]) for e in events if e["name"].startswith("$")}
    for e in events:
        seconds = e["dur"] / 1e6
        if e["name"] == WAIT:
            wall += seconds
        elif (e["pid"], e["tid"]) in host:
            continue
        elif not e["name"].startswith(("end: ", "ThunkExecutor")) and not CONTAINER.match(
            e["name"]
        ):
            p = part(e["name"], names.get(e["name"], ""))
            if p is not None:
                parts[p] = parts.get(p, 0.0) + seconds
    return {"parts_s": parts, "device_wall_s": wall}
