"""The `two_process` section (run only when named: `jaxspec bench --pairs real --sections
two_process`): the verifier and the edge as two processes, each pinned to its own core with
one compute thread, over real gRPC on loopback with a simulated round trip; beside them,
cloud decoding two ways, both on the verifier's core.

On this 2-core machine it is the honest stand-in for an edge device and a cloud box: the
in-process sweep (`latency`) shares one process and both cores between the two sides.
The verifier: `python -m verify serve --checkpoint <target>` pinned to core 0 (affinity set
as the process starts, before JAX makes its threads; JAXSPEC_KERNEL_THREADS=1 and XLA's Eigen
pool off). The edge: `python -m jaxspec_apps.bench.twoproc_edge` pinned to core 1 (its doc
says what it times). "Predicted" is the papers' model (`jaxspec.decoding.analytic`) at the t_d, t_v
and acceptance measured in the same run; the ratios are measured / predicted.

The cloud baselines, both the target on core 0 with one thread:
    cloud_streamed  cloud decoding as its user gets it: the target's plain decode loop
                    (`twoproc_cloud`, run before the verifier starts, so the core is its
                    own), one round trip per request and then the tokens as they are made:
                    per token after the first round trip, the loop's time over its tokens
                    at every round trip. `edge_over_cloud_ar` (the edge user's tokens/s
                    over this baseline's) is read against it.
    cloud_gamma0    the verifier's own gamma-0 sessions, pipelined: 8 empty blocks in
                    flight, each answered with one token, so the verifier steps them back to
                    back (a stream through the verifier); `edge_over_cloud_gamma0` is read
                    against it, and `gamma0_over_decode` is its time per token at RTT 0 over
                    the loop's: the verifier's single-token path against the plain loop.
    cloud_gamma0_sync  the same one block at a time, a round trip per token: what the
                    section called "cloud decoding" before it had the streamed baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from jaxspec.decoding import analytic
from jaxspec_apps.bench.section import Context, Section, sizes
from verify.process import VerifierProcess

# This section's sizes (the verifier and the edge as two pinned processes; `chat` is also
# round_profile's prompt).
Config = sizes(
    "two_process_",
    rtts_ms=(0.0, 20.0, 50.0, 100.0),
    new_tokens=64,
    repeats=2,
    max_len=512,
    chat="Write a Python function that returns the n-th Fibonacci number.",
)


QUICK_SIZES = Config(rtts_ms=(0.0, 50.0), new_tokens=8, repeats=1, max_len=128)

ONE_THREAD = {"JAXSPEC_KERNEL_THREADS": "1"}
EIGEN_OFF = "--xla_cpu_multi_thread_eigen=false"


def _env() -> dict[str, str]:
    flags = f"{os.environ.get('XLA_FLAGS', '')} {EIGEN_OFF}".strip()
    return dict(os.environ, **ONE_THREAD, XLA_FLAGS=flags)


def _cores() -> tuple[int | None, int | None]:
    """(verifier core, edge core): 0 and 1 when this process may use both, else unpinned."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return (mine[0], mine[1]) if len(mine) >= 2 else (None, None)


def _serve_args(ctx: Context, max_len: int) -> list[str]:
    p = ctx.p
    return ["--checkpoint", ctx.target_name, "--max-sessions", "2", "--max-len", str(max_len),
            "--max-gamma", str(p.gamma), "--full-warmup"]  # fmt: skip


def _cloud(ctx: Context, core: int | None) -> dict[str, Any]:
    """The streamed cloud baseline: the target's decode loop in a process on `core`."""
    p = ctx.p
    return _side("cloud", ["--target", ctx.target_name, "--chat", p.two_process.chat,
                           "--new-tokens", str(p.two_process.new_tokens),
                           "--repeats", str(p.two_process.repeats)], core)  # fmt: skip


def _edge(ctx: Context, address: str, core: int | None) -> dict[str, Any]:
    p = ctx.p
    return _side("edge", ["--verifier", address, "--draft", ctx.draft_name,
                          "--chat", p.two_process.chat, "--gamma", str(p.gamma),
                          "--new-tokens", str(p.two_process.new_tokens),
                          "--rtts-ms", ",".join(map(str, p.two_process.rtts_ms)),
                          "--repeats", str(p.two_process.repeats)], core)  # fmt: skip


def _side(side: str, args: list[str], core: int | None) -> dict[str, Any]:
    """Run `python -m jaxspec_apps.bench.twoproc_<side> ARGS` (pinned to `core`); the JSON
    its last line prints."""
    cmd = [sys.executable, "-m", f"jaxspec_apps.bench.twoproc_{side}", *args]
    if core is not None:
        cmd += ["--core", str(core)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=False)
    if out.returncode:
        raise RuntimeError(f"the {side} process failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def predict(measured: dict[str, Any], gamma: int) -> None:
    """Add each row's predicted times per token and the ratios (in place): the model at the
    papers' depth (`depth`; the session ran at `session_depth`), and the edge user's
    tokens/s over each cloud baseline's (`cloud_streamed`, `cloud_gamma0`)."""
    t_d, t_v = measured["t_d"], measured["t_v"]
    for r in measured["rows"]:
        rtt, a = r["rtt_ms"] / 1e3, r["pipelined_alpha"]
        r["predicted_pipelined"] = float(
            analytic.pipelined_token_time(gamma, a, t_d, rtt, t_v, r["depth"])
        )
        r["predicted_sync"] = float(analytic.sync_token_time(gamma, r["sync_alpha"], t_d, rtt, t_v))
        r["pipelined_vs_model"] = r["pipelined"] / r["predicted_pipelined"]
        r["sync_vs_model"] = r["sync"] / r["predicted_sync"]
        r["edge_over_cloud_ar"] = r["cloud_streamed"] / r["pipelined"]  # tokens/s ratio
        r["edge_over_cloud_gamma0"] = r["cloud_gamma0"] / r["pipelined"]


def run_section(ctx: Context) -> dict[str, Any]:
    """The streamed cloud on the verifier's core, then the pinned verifier and the pinned
    edge's sweep against it; predict, and check every session's tokens against the
    cloud's."""
    p = ctx.p
    server_core, edge_core = _cores()
    cloud = _cloud(ctx, server_core)
    server = VerifierProcess(_serve_args(ctx, p.two_process.max_len), env=_env())
    with server:  # started here
        if server_core is not None:
            os.sched_setaffinity(server.pid, {server_core})
        address = server.wait_ready(timeout_s=1800)
        measured = _edge(ctx, address, edge_core)
    for r in measured["rows"]:
        r["cloud_streamed"] = cloud["s_per_token"]
    if cloud["tokens"] != measured.pop("reference"):
        measured["tokens_differ"].append("the streamed cloud's (plain decoding)")
    predict(measured, p.gamma)
    rows = measured["rows"]
    at50 = [r for r in rows if r["rtt_ms"] == 50] or rows[-1:]
    at0 = [r for r in rows if r["rtt_ms"] == 0] or rows[:1]
    return measured | {
        "command": ctx.command,
        "gamma": p.gamma,
        "new_tokens": p.two_process.new_tokens,
        "verifier_core": server_core,
        "pinned": edge_core is not None,
        "cloud_streamed": cloud["s_per_token"],
        "pipelined_vs_model": max(r["pipelined_vs_model"] for r in rows),  # the worst
        "edge_over_cloud_ar": at50[0]["edge_over_cloud_ar"],
        "edge_over_cloud_gamma0": at50[0]["edge_over_cloud_gamma0"],
        "gamma0_over_decode": at0[0]["cloud_gamma0"] / cloud["s_per_token"],
        "at_rtt_ms": at50[0]["rtt_ms"],
    }


KINDS = {"pipelined": "pipelined", "sync": "sync", "cloud_gamma0": "gamma 0, pipelined",
         "cloud_gamma0_sync": "gamma 0, a round trip per token"}  # fmt: skip


def failures(r: dict[str, Any]) -> list[str]:
    """Sessions whose greedy tokens differ from the others' fail the command."""
    return [f"tokens differ: {x}" for x in r["tokens_differ"]]


SECTION = Section("two_process", run_section, failures=failures)
