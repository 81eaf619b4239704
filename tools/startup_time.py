"""Start-up time of `python -m verify serve`: cold (an empty compilation cache) then warm (a
second start over the cache the first one filled), each from process start to the
"listening" line (port bound) and to the "serving" line (every step shape compiled), and the
server's resident memory then.

    python tools/startup_time.py                        # the default target (SmolLM2)
    python tools/startup_time.py --json startup.json -- --max-sessions 16   # serve flags after --
    python tools/startup_time.py -- --pair tiny                            # the shipped tiny target

Each run is `python -m verify serve --port P --compilation-cache DIR [flags]`, DIR a fresh
temporary directory (kept with --cache-dir). Prints both times and the load average before
and after, since on shared cores the numbers move with whatever else runs. Imports
`verify.process` only (stdlib): the timing starts before the server imports anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence

from verify.process import VerifierProcess

LISTENING = re.compile(r"jaxspec verifier listening on")
SHAPES = re.compile(r"warming up: (\d+) shapes")


def time_start(serve_args: Sequence[str], timeout_s: float) -> dict[str, float | int]:
    """Start one server, time its "listening" and "serving" lines, stop it."""
    server = VerifierProcess(list(serve_args))
    t0 = time.monotonic()
    listening = None
    with server:
        deadline = t0 + timeout_s
        while server.ready_address() is None:
            if listening is None and LISTENING.search(server.log):
                listening = time.monotonic() - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"not serving after {timeout_s:.0f} s:\n{server.log_tail()}")
            time.sleep(0.02)
        serving = time.monotonic() - t0
        rss_mib = _rss_mib(server.pid)
    if listening is None:
        listening = serving  # printed in the same poll
    shapes = SHAPES.search(server.log)
    return {
        "listening_s": round(listening, 2),
        "serving_s": round(serving, 2),
        "shapes": int(shapes.group(1)) if shapes else -1,
        "rss_mib_when_serving": rss_mib,
    }


def _rss_mib(pid: int | None) -> float | None:
    """Resident memory of the server process (Linux /proc), when it turned ready."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None
    return round(kb / 1024, 1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=None, help="compilation cache (default: a fresh temp)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="most time per start")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("serve_args", nargs="*", help="flags for `python -m verify serve` (after --)")
    args = p.parse_args(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="jaxspec-startup-xla-")
    if os.listdir(cache):
        p.error(f"--cache-dir {cache} is not empty: the cold start would not be cold")
    serve_args = [*args.serve_args, "--compilation-cache", cache]
    command = " ".join(["python -m verify serve", *serve_args, "--port 0"])
    out: dict[str, object] = {"command": command}
    try:
        out["load_before"] = [round(x, 2) for x in os.getloadavg()]
        out["cold"] = time_start(serve_args, args.timeout_s)
        out["warm"] = time_start(serve_args, args.timeout_s)
        out["load_after"] = [round(x, 2) for x in os.getloadavg()]
        out["cpus"] = os.cpu_count()
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)
    for key, value in out.items():
        print(f"{key:>12}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
