"""Time from Ctrl-C (SIGINT to the demo's process group, as a terminal sends it) to the
exit of `jaxspec demo`, while its tenants generate.

    python tools/ctrl_c_time.py [--pair tiny] [--wait-s 4]

Starts `jaxspec demo --plain --seconds 120`, waits for its "running" line, lets the tenants
generate `--wait-s` seconds, sends SIGINT and prints the seconds to the exit and the status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", default="tiny")
    p.add_argument("--wait-s", type=float, default=4.0)
    args = p.parse_args()
    cmd = ["jaxspec", "demo", "--pair", args.pair, "--plain", "--seconds", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 300
    while not any("running" in line for line in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(args.wait_s)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(60)
    print(f"exit {time.monotonic() - sent:.2f} s after Ctrl-C, status {proc.returncode}")


if __name__ == "__main__":
    main()
