"""The `two_process` section (run only when named: `jaxspec bench --pairs real --sections
two_process`): the verifier and the edge as two processes, each pinned to its own core with
one compute thread, over real gRPC on loopback with a simulated round trip; beside them,
cloud decoding by the same verifier process at the same round trip.

On this 2-core machine it is the honest stand-in for an edge device and a cloud box: the
in-process sweep (`latency`) shares one process and both cores between the two sides.
The verifier: `python -m verify serve --checkpoint <target>` pinned to core 0 (affinity set
as the process starts, before JAX makes its threads; JAXSPEC_INT4_THREADS=1 and XLA's Eigen
pool off). The edge: `python -m jaxspec_apps.bench.twoproc_edge` pinned to core 1 (its doc
says what it times). "Predicted" is the papers' model (`jaxspec.decoding.analytic`) at the t_d, t_v
and acceptance measured in the same run; the ratios are measured / predicted and the edge
user's tokens/s over cloud decoding's at the same round trip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from jaxspec.decoding import analytic
from jaxspec_apps.bench.section import Context, Page, Section
from verify.process import VerifierProcess

ONE_THREAD = {"JAXSPEC_INT4_THREADS": "1"}
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


def _edge(ctx: Context, address: str, core: int | None) -> dict[str, Any]:
    p = ctx.p
    cmd = [sys.executable, "-m", "jaxspec_apps.bench.twoproc_edge", "--verifier", address,
           "--draft", ctx.draft_name, "--chat", p.two_process_chat,
           "--gamma", str(p.gamma), "--new-tokens", str(p.two_process_new_tokens),
           "--rtts-ms", ",".join(map(str, p.two_process_rtts_ms)),
           "--repeats", str(p.two_process_repeats)]  # fmt: skip
    if core is not None:
        cmd += ["--core", str(core)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), check=False)
    if out.returncode:
        raise RuntimeError(f"the edge process failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def predict(measured: dict[str, Any], gamma: int) -> None:
    """Add each row's predicted times per token and the ratios (in place)."""
    t_d, t_v = measured["t_d"], measured["t_v"]
    for r in measured["rows"]:
        rtt, a = r["rtt_ms"] / 1e3, r["pipelined_alpha"]
        r["predicted_pipelined"] = float(
            analytic.pipelined_token_time(gamma, a, t_d, rtt, t_v, r["depth"])
        )
        r["predicted_sync"] = float(analytic.sync_token_time(gamma, r["sync_alpha"], t_d, rtt, t_v))
        r["pipelined_vs_model"] = r["pipelined"] / r["predicted_pipelined"]
        r["sync_vs_model"] = r["sync"] / r["predicted_sync"]
        r["edge_over_cloud_ar"] = r["cloud_ar"] / r["pipelined"]  # tokens/s ratio


def run_section(ctx: Context) -> dict[str, Any]:
    """Start the pinned verifier, run the pinned edge's sweep against it, predict."""
    p = ctx.p
    server_core, edge_core = _cores()
    server = VerifierProcess(_serve_args(ctx, p.two_process_max_len), env=_env())
    with server:  # started here
        if server_core is not None:
            os.sched_setaffinity(server.pid, {server_core})
        address = server.wait_ready(timeout_s=1800)
        measured = _edge(ctx, address, edge_core)
    predict(measured, p.gamma)
    at50 = [r for r in measured["rows"] if r["rtt_ms"] == 50] or measured["rows"][-1:]
    return measured | {
        "command": ctx.command,
        "gamma": p.gamma,
        "new_tokens": p.two_process_new_tokens,
        "verifier_core": server_core,
        "pinned": edge_core is not None,
        "pipelined_vs_model": at50[0]["pipelined_vs_model"],
        "edge_over_cloud_ar": at50[0]["edge_over_cloud_ar"],
        "at_rtt_ms": at50[0]["rtt_ms"],
    }


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "two processes" section of BENCHMARKS.md."""
    pinned = ("each pinned to its own core (verifier on core 0, edge on core 1)" if r["pinned"]
              else "unpinned (fewer than 2 cores were available)")  # fmt: skip
    lines = [
        "## Two processes: the edge and the verifier on their own cores",
        "",
        f"Produced by `{r['command']}`: `python -m verify serve` and the edge "
        f"(`jaxspec_apps.bench.twoproc_edge`) as two processes, {pinned}, one compute thread "
        f"each, over gRPC on loopback with a simulated round trip; gamma {r['gamma']}, "
        f"{r['new_tokens']} new tokens, T = 0, the best of the repeats. Measured on the edge's "
        f"core: t_d = {r['t_d'] * 1e3:.1f} ms per drafted token; the verifier's step after a "
        f"sync block: t_v = {r['t_v'] * 1e3:.1f} ms. Times are ms per token after the first "
        "round trip; predicted = the papers' model at those t_d, t_v and the measured "
        "acceptance; edge/cloud = the edge user's tokens/s over cloud decoding's (gamma 0 "
        "through the same verifier) at the same round trip.",
        "",
        "| RTT ms | depth | pipelined | predicted | sync | predicted | cloud decoding | "
        "pipelined / model | edge / cloud |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['rtt_ms']:g} | {x['depth']} | {x['pipelined'] * 1e3:.1f} | "
            f"{x['predicted_pipelined'] * 1e3:.1f} | {x['sync'] * 1e3:.1f} | "
            f"{x['predicted_sync'] * 1e3:.1f} | {x['cloud_ar'] * 1e3:.1f} | "
            f"{x['pipelined_vs_model']:.2f} | {x['edge_over_cloud_ar']:.2f} |"
        )
    return [*lines, *page.img("two_process", "two processes: time per token vs RTT")]


def plot(r: dict[str, Any], bench: Any) -> dict[str, str]:
    """bench/two_process.png: measured and predicted time per token against the RTT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [row["rtt_ms"] for row in r["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("pipelined", "o-"), ("sync", "s-"), ("cloud_ar", "^-")):
        ax.plot(x, [row[key] * 1e3 for row in r["rows"]], style, label=f"{key} (measured)")
    for key in ("pipelined", "sync"):
        ax.plot(x, [row[f"predicted_{key}"] * 1e3 for row in r["rows"]], "--",
                label=f"{key} (model)")  # fmt: skip
    ax.set_xlabel("round trip (ms)")
    ax.set_ylabel("ms per token")
    ax.legend()
    fig.tight_layout()
    fig.savefig(bench / "two_process.png", dpi=100)
    plt.close(fig)
    return {"two_process": "bench/two_process.png"}


def failures(r: dict[str, Any]) -> list[str]:
    """Sessions whose greedy tokens differ from the others' fail the command."""
    return [f"tokens differ: {x}" for x in r["tokens_differ"]]


SECTION = Section("two_process", run_section, markdown, plot, failures=failures)
