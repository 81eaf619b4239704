"""`VerifierProcess`: a `python -m verify serve` subprocess that never outlives its owner.

The demo, the load generator and the tests start real verifier services this way: wait for
the "serving ... on host:port" line, keep reading the log (so the pipe never fills), stop
with SIGTERM (drain) and SIGKILL after a timeout. Used as a context manager, a crash of the
owner still ends the server.
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

_READY = re.compile(r"jaxspec verifier serving .* on (\S+):(\d+)")


class VerifierProcess:
    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int = 0,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 180.0,
    ):
        self.args = list(args)
        self.port = port
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def start(self) -> VerifierProcess:
        env = dict(os.environ, **(self.env or {}))
        cmd = [sys.executable, "-m", "verify", "serve", *self.args, "--port", str(self.port)]
        self._ready.clear()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(timeout_s=1.0)
                raise RuntimeError(f"the verifier did not start:\n{self.log[-4000:]}")
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)
            m = _READY.search(line)
            if m and not self._ready.is_set():
                self.port = int(m.group(2))
                self._ready.set()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

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

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (drain), then SIGKILL if it has not exited after `timeout_s`."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def __enter__(self) -> VerifierProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
