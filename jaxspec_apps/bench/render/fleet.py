"""The `fleet` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "A fleet of verifiers" section of BENCHMARKS.md."""
    one, two = r["throughput"]
    f = r["failover"]
    return [
        "## A fleet of verifiers",
        "",
        f"Measured by `{r['command']}` on this machine ({r['cpus']} cores; the replicas and",
        "the clients' drafters share them). Target and draft: the shipped pair; clients draft",
        "at W4A16, pipelined, gamma 4, sparse q, T = 1.",
        "",
        "| replicas | sessions run | committed tokens | seconds | tokens/s |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {t['replicas']} | {t['sessions']} | {t['tokens']} | {t['seconds']} | "
          f"{t['tokens_per_s']} |" for t in (one, two)),
        "",
        f"2 replicas ÷ 1: **{r['scaling']:.2f}x** aggregate tokens/s. On one 2-core machine",
        "the replicas take cores from each other and from the drafters, so no gain is expected",
        "here. Replicas share nothing (a session lives in one stream on one replica), so on",
        "separate hosts each adds its own capacity: by the capacity model, N replicas hold N",
        "times the clients at the same per-client rate, up to what the network and the",
        "balancer carry.",
        "",
        f"Failover: {f['sessions']} sessions over 2 replicas, one SIGKILLed after a quarter of",
        f"the tokens: {f['sessions_moved']} sessions moved ({f['resumes']} resumes); from the",
        f"kill to a moved session's next committed token: median {f['move_s_median']} s, max",
        f"{f['move_s_max']} s. Tokens equal to the undisturbed run: "
        f"**{'yes' if f['tokens_equal'] else 'NO'}** (0 lost, 0 repeated).",
    ]  # fmt: skip
