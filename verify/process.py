"""`VerifierProcess`: a `python -m verify serve` subprocess that never outlives its owner.

The demo, the tests and tools start real verifier services this way. Three layers keep one
from becoming an orphan:
  1. `VerifierProcess` is a context manager: leaving it for any reason (normal end, Ctrl-C,
     an exception) sends SIGTERM (the server drains and exits), then SIGKILL after
     `stop_timeout_s`, and reaps the process;
  2. owners turn SIGTERM/SIGHUP into the same orderly exit (see `jaxspec_apps.demo.run`);
  3. on Linux the child asks the kernel for SIGTERM when the thread that spawned it dies
     (`PR_SET_PDEATHSIG`, set by a small launcher that then execs the server), which covers
     even a SIGKILLed owner. Spawn from a thread that lives as long as the server should.
The child runs in its own session, so a Ctrl-C typed in the terminal reaches the owner only,
which stops the server after closing its sessions (not the other way round).

Stdlib only: the CLI may import it before anything heavy.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

READY = re.compile(r"jaxspec verifier serving (\S+) on (\S+):(\d+)")


def parse_ready_line(line: str) -> tuple[str, int] | None:
    """(host, port) from the verifier's `jaxspec verifier serving <ckpt> on <host>:<port>`."""
    m = READY.search(line)
    return (m.group(2), int(m.group(3))) if m else None


# Runs in the child before it becomes the server: ask Linux for SIGTERM when the parent dies
# (the flag survives exec), give up if the parent is already gone, then exec the server.
# A launcher rather than a preexec_fn, which would run Python between fork and exec in a
# process that may have JAX's threads.
_LAUNCHER = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _command(python: str, args: Sequence[str]) -> list[str]:
    """`python -m verify serve ARGS`, behind the parent-death launcher on Linux."""
    cmd = [python, "-m", "verify", "serve", *args]
    if sys.platform.startswith("linux"):
        return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *cmd]
    return cmd


class VerifierProcess:
    """`python -m verify serve ARGS` on a loopback port (`port=0`: a free one, kept for
    restarts once known).

    `start()` returns at once; `wait_ready()` blocks until the "serving" line names the port
    (`ready_address()` polls). `start()` again after a crash restarts it on the same port.
    Leaving the `with` block stops the server.
    """

    def __init__(
        self,
        serve_args: Sequence[str] = (),
        *,
        port: int = 0,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.serve_args = list(serve_args)
        self.python = python
        self.env = env
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.host: str | None = None
        self.port: int = port
        self.lines: list[str] = []  # stdout and stderr, every start
        self._ready = threading.Event()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def address(self) -> str:
        if not self._ready.is_set():
            raise RuntimeError("the verifier is not serving yet")
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def start(self) -> VerifierProcess:
        """Spawn the server; its output is kept in `lines` (shown if it fails)."""
        self._ready.clear()
        self.proc = subprocess.Popen(
            _command(self.python, [*self.serve_args, "--port", str(self.port)]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if self.env is None else dict(os.environ, **self.env),
            start_new_session=True,  # the terminal's Ctrl-C is the owner's to handle
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # read to the end, so the pipe never fills
            self.lines.append(line)
            addr = parse_ready_line(line)
            if addr is not None and proc is self.proc and not self._ready.is_set():
                self.host, self.port = addr
                self._ready.set()

    def ready_address(self) -> str | None:
        """The address once serving, None while it starts; raises with its log if it exited."""
        if self.proc is None:
            raise RuntimeError("start() first")
        if self._ready.is_set():
            return self.address
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the verifier exited with status {self.proc.returncode}:\n{self.log_tail()}"
            )
        return None

    def wait_ready(self, timeout_s: float = 600.0) -> str:
        """Block until the server takes requests; its address. Raises with its log if it
        exits or stays silent past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while (addr := self.ready_address()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the verifier did not start in {timeout_s:.0f} s")
            self._ready.wait(0.05)
        return addr

    def log_tail(self, n: int = 4000) -> str:
        return self.log[-n:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the crash a fault test wants (no drain, no goodbye)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> int | None:
        """SIGTERM (drain), SIGKILL after `stop_timeout_s`; reaps the child. Idempotent."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
            except KeyboardInterrupt:  # a second Ctrl-C while draining: stop waiting
                proc.kill()
            finally:
                proc.wait()
        return proc.returncode

    def __enter__(self) -> VerifierProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
