"""Ctrl-C ends `python -m verify serve`, `python -m edge generate` and `jaxspec demo` within
seconds, during start-up too (issue 37): a model loading or a step shape compiling in a
worker thread is abandoned (`jaxspec_host.worker`), not waited for. Each command runs in a
fresh interpreter with Python's own SIGINT handler (a test run started in the background
ignores SIGINT, and every child would inherit that; see tests/test_demo.py), the tiny pair,
and gets SIGINT once its start-up is under way. The bounds are generous: they tell "exits
promptly" from "waits for a compilation to finish", not a speed."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXIT_BOUND_S = 20.0  # from SIGINT to the process's end
START_BOUND_S = 240.0  # from launch to the start-up line that the signal waits for
# Run a module as `python -m MODULE ARGS` with Python's default SIGINT handler installed.
RUN_MODULE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = sys.argv[1]; del sys.argv[1]; runpy.run_module(sys.argv[0], "
    "run_name='__main__', alter_sys=True)"
)


def interrupt_when(module: str, args: list[str], line: str) -> tuple[int, str, float]:
    """Start `python -m module args`, send SIGINT once `line` appears in its output; (exit
    status, all its output, seconds from the signal to its end)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_MODULE, module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,  # a Ctrl-C of the test run does not reach it
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for text in proc.stdout:
            lines.append(text)
            if line in text:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(START_BOUND_S), "".join(lines)[-3000:]
        os.kill(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        try:
            code = proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {EXIT_BOUND_S} s after SIGINT") from None
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return code, "".join(lines), took


def clean(output: str) -> None:
    """No traceback and no abort from a thread left inside XLA at the interpreter's end."""
    for bad in ("Traceback", "terminate called", "FATAL", "Fatal Python error"):
        assert bad not in output, output[-3000:]


def test_ctrl_c_while_the_verifier_warms_up():
    """SIGINT while the verifier compiles its step shapes (cache off, so they do compile):
    it stops at once, exit 0, saying so."""
    args = ["serve", "--pair", "tiny", "--port", "0", "--compilation-cache", "none"]
    code, out, took = interrupt_when("verify", args, "warm-up: 1/")
    clean(out)
    assert code == 0 and "stopping: interrupted while warming up" in out, out[-3000:]
    print(f"[verify serve: exited {took:.2f} s after SIGINT]")


def test_ctrl_c_while_the_edge_waits_for_its_verifier():
    """SIGINT while `edge generate` retries a verifier that is not there: one line, 130."""
    args = ["generate", "--verifier", "127.0.0.1:1", "--pair", "tiny", "--prompt", "x"]
    code, out, took = interrupt_when("edge", args, "retrying until")
    clean(out)
    assert code == 130 and out.rstrip().endswith("python -m edge generate: interrupted"), out
    print(f"[edge generate: exited {took:.2f} s after SIGINT]")


def test_ctrl_c_while_the_demo_compiles_its_draft():
    """SIGINT while the demo compiles the draft (a worker thread) and its verifier warms up:
    exit 130 with one line, the verifier stopped with it."""
    args = ["demo", "--pair", "tiny", "--plain", "--num-tenants", "1"]
    code, out, took = interrupt_when("jaxspec_apps.cli", args, "compiling the draft model")
    clean(out)
    assert code == 130 and "jaxspec demo: interrupted" in out, out[-3000:]
    print(f"[jaxspec demo: exited {took:.2f} s after SIGINT]")


ABANDON = """
import asyncio, sys, time
from jaxspec_host.worker import abandoned, exit_if_abandoned, in_thread

async def main():
    work = in_thread(time.sleep, 600, name="slow")  # a compilation that will not end soon
    try:
        await asyncio.wait_for(work, 0.2)
    except asyncio.TimeoutError:
        print("gave up on", abandoned(), flush=True)
    return 7

code = asyncio.run(main())  # (a default-executor thread would hold this for 10 minutes)
sys.exit(exit_if_abandoned(code))
"""


def test_a_worker_is_abandoned_not_waited_for():
    """`in_thread`'s work is not waited for by `asyncio.run` nor by the exit: the process
    ends with the command's status while the worker still sleeps (10 minutes). A worker
    that were joined would make the subprocess run past its timeout, failing the test."""
    done = subprocess.run(
        [sys.executable, "-c", ABANDON],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 7, done.stderr
    assert "gave up on ['slow']" in done.stdout
