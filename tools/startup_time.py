"""Start-up figures in one run, each timed from its command's start by this script's clock:

  forward   compile one SmolLM2 forward shape (1 x 1 token, compilation cache off) and its step
  serve     `python -m verify serve --checkpoint smollm2`: "listening", "serving" (the first
            shapes warm), the first edge session answered (a gamma-0 `edge generate` started
            once serving), and every shape warm ("fully warm"); cold (empty compilation and
            trace cache) then warm (a second start over what the first one kept)
  demo      `jaxspec demo --plain`: the first verified token, cold then warm caches
  build     the W4A16 copy's first build (GPTQ), in a private $JAXSPEC_HOME over the
            already converted SmolLM2
  first     `jaxspec demo` in a private $JAXSPEC_HOME and empty caches: fetch, convert,
            build the draft, compile (minutes; only with --first-ever)

    python tools/startup_time.py                         # forward, serve, demo, build
    python tools/startup_time.py --only serve -- --max-sessions 16   # serve flags after --
    python tools/startup_time.py --first-ever --json startup.json

Prints the load average before and after: on shared cores the numbers move with whatever
else runs. Imports the standard library and `verify.process` only: every timed command is a
fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from verify.process import VerifierProcess

LISTENING = re.compile(r"jaxspec verifier listening on")
FULLY_WARM = re.compile(r"fully warm: (\d+) shapes")
FIRST_TOKENS = re.compile(r"first tokens")
PAIR = ["--checkpoint", "smollm2"]
FIGURES = ("forward", "serve", "demo", "build")

FORWARD = """\
import json, time, jax, jax.numpy as jnp
from jaxspec.ckpts.checkpoint import load
from jaxspec.nn.model import forward, init_cache
from jaxspec_host import hub
jax.config.update("jax_enable_compilation_cache", False)
m = load(str(hub.ensure("smollm2")))
f = jax.jit(forward, static_argnums=0)
tok = jnp.zeros((1, 1), jnp.int32)
args = (m.module, m.params, tok, tok, tok > -1, init_cache(m.config, 1, 512))
t0 = time.perf_counter(); lowered = f.lower(*args)
t1 = time.perf_counter(); compiled = lowered.compile()
t2 = time.perf_counter(); jax.block_until_ready(compiled(*args[1:]))
steps = []
for _ in range(20):
    t = time.perf_counter(); jax.block_until_ready(compiled(*args[1:]))
    steps.append(time.perf_counter() - t)
print(json.dumps({"trace_lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
                  "step_ms_median": round(1e3 * sorted(steps)[10], 2)}))
"""

BUILD = """\
import json, sys, time
from jaxspec_host import hub
ends = {}  # stage -> seconds from the start to its last progress event
def progress(stage, done, total):
    ends[stage] = round(time.perf_counter() - t0, 1)
t0 = time.perf_counter(); hub.ensure_copy("smollm2-w4a16", progress=progress)
print(json.dumps({"build_s": round(time.perf_counter() - t0, 1), "stage_ends_s": ends}))
"""


def _json_line(cmd: list[str], env: dict | None = None) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_forward() -> dict:
    return _json_line([sys.executable, "-c", FORWARD])


def time_build(home: pathlib.Path) -> dict:
    """The W4A16 copy built anew in `home` over a link to the converted base model."""
    base = pathlib.Path(os.environ.get("JAXSPEC_HOME", "~/.cache/jaxspec")).expanduser()
    (home / "models").mkdir(parents=True, exist_ok=True)
    (home / "models" / "smollm2-135m-instruct").symlink_to(
        base / "models" / "smollm2-135m-instruct"
    )
    return _json_line([sys.executable, "-c", BUILD], dict(os.environ, JAXSPEC_HOME=str(home)))


def _first_session_s(address: str) -> float:
    """Seconds for a gamma-0 edge session of one token against `address` (process start to
    exit: the edge's own start-up included)."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "edge", "generate", "--verifier", address, *PAIR,
           "--gamma", "0", "--max-new-tokens", "1", "--prompt", "Hello"]  # fmt: skip
    subprocess.run(cmd, capture_output=True, check=True)
    return time.monotonic() - t0


def time_serve(serve_args: Sequence[str], timeout_s: float) -> dict:
    """One server start: its "listening", "serving", first session and "fully warm" times."""
    server = VerifierProcess([*PAIR, *serve_args])
    t0 = time.monotonic()
    out: dict[str, float | int | None] = {"listening_s": None}
    with server:
        deadline = t0 + timeout_s
        while (address := server.ready_address()) is None:
            if out["listening_s"] is None and LISTENING.search(server.log):
                out["listening_s"] = round(time.monotonic() - t0, 2)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not serving after {timeout_s:.0f} s:\n{server.log_tail()}")
            time.sleep(0.02)
        out["serving_s"] = round(time.monotonic() - t0, 2)
        first = _first_session_s(address)
        out["first_session_answered_s"] = round(out["serving_s"] + first, 2)
        out["edge_session_s"] = round(first, 2)
        while not (warm := FULLY_WARM.search(server.log)) and time.monotonic() < deadline:
            time.sleep(0.1)
        out["fully_warm_s"] = round(time.monotonic() - t0, 1) if warm else None
        out["shapes"] = int(warm.group(1)) if warm else -1
    return out


def time_demo(cache: str, env: dict | None = None, timeout_s: float = 1800.0) -> dict:
    """`jaxspec demo --plain` until its end: the first "first tokens" line and the end."""
    cmd = ["jaxspec", "demo", "--plain", "--compilation-cache", cache, "--max-new-tokens", "16"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    first = None
    for line in proc.stdout:
        if first is None and FIRST_TOKENS.search(line):
            first = round(time.monotonic() - t0, 1)
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
    proc.wait()
    return {"first_verified_token_s": first, "ended_s": round(time.monotonic() - t0, 1),
            "rc": proc.returncode}  # fmt: skip


def _cold_and_warm(run: Callable[[str], dict], cache: str) -> dict:
    return {"cold": run(cache), "warm": run(cache)}


def measure(args: argparse.Namespace, scratch: pathlib.Path) -> dict:
    """Every figure asked for, in the order of the module doc."""
    out: dict[str, object] = {"load_before": [round(x, 2) for x in os.getloadavg()]}
    only = set(args.only or FIGURES) | ({"first"} if args.first_ever else set())
    if "forward" in only:
        out["forward_1x1"] = time_forward()
    if "serve" in only:
        serve = [*args.serve_args, "--compilation-cache", str(scratch / "serve-xla")]
        out["serve"] = {"cold": time_serve(serve, args.timeout_s),
                        "warm": time_serve(serve, args.timeout_s)}  # fmt: skip
    if "demo" in only:
        out["demo"] = _cold_and_warm(time_demo, str(scratch / "demo-xla"))
    if "build" in only:
        out["w4a16_build"] = time_build(scratch / "build-home")
    if "first" in only:
        env = dict(os.environ, JAXSPEC_HOME=str(scratch / "first-home"))
        out["demo_first_ever"] = time_demo(str(scratch / "first-xla"), env)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out["cpus"] = os.cpu_count()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=FIGURES, help="these figures only")
    p.add_argument("--first-ever", action="store_true", help="also the first-ever demo")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="most time per start")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("serve_args", nargs="*", help="flags for `python -m verify serve` (after --)")
    args = p.parse_args(argv)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-startup-"))
    try:
        out = measure(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for key, value in out.items():
        print(f"{key:>16}: {value}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
