"""The `roundprofile` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page, part, stalls_table, table
from jaxspec_apps.bench.roundprofile import ACCOUNT, BUCKETS, PREFILL


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "where a round's time goes" section of BENCHMARKS.md."""
    plain = r["modes"]["plain"]["s_per_token"]
    lines = [
        "## Where a round's time goes (profile per mode)",
        "",
        f"Produced by `{r['command']}`: one chat prompt, {r['new_tokens']} new tokens, T = 0, "
        f"gamma {r['gamma']}, after a warm-up; each mode once unprofiled (ms per token) and "
        "once under cProfile, its functions' own time in buckets (jaxspec_apps/bench/"
        "roundprofile.py: device = the host waiting for the model's compute; dispatch = "
        "calling jitted functions; idle = the event loop waiting for the verifier's thread; "
        "jaxspec = our Python). The profiler inflates the Python "
        "buckets: read them as where to look, not as exact costs.",
        "",
        "| mode | ms/token | × plain | " + " | ".join(BUCKETS) + " |",
        "|---|---:|---:|" + "---:|" * len(BUCKETS),
    ]
    for name, m in r["modes"].items():
        shares = " | ".join(f"{100 * m['shares'][b]:.0f}%" for b in BUCKETS)
        lines.append(f"| {name} | {m['s_per_token'] * 1e3:.1f} | "
                     f"{m['s_per_token'] / plain:.2f} | {shares} |")  # fmt: skip
    for name, m in r["modes"].items():
        top = "; ".join(f"{t['function']} {t['ms_per_token']:.2f}" for t in m["top"][:5])
        lines += ["", f"Top own time, {name} (ms per token, profiled): {top}."]
    account = account_md(r["device_account"]) if "device_account" in r else []
    return [*lines, *account, *programs_md(r["program_vs_parts"]), *stalls_md(r)]


def account_md(a: dict[str, Any]) -> list[str]:
    """The co-located round's device account (`colocated_account`)."""
    rounds = {k: v for k, v in a["parts_s"].items() if not k.startswith("prefill")}
    busy = sum(rounds.values())
    parts = [f"| {k} | {rounds[k] * 1e3:.2f} | {100 * rounds[k] / busy:.0f}% |" for k in ACCOUNT
             if k in rounds]  # fmt: skip
    parts += [f"| {k} | {a['parts_s'][k] * 1e3:.1f} | |" for k in PREFILL if k in a["parts_s"]]
    return part(
        "### The co-located round's device account (`jax.profiler`)",
        f"One co-located call (γ {a['gamma']}, {a['new_tokens']} new tokens, T = 0, full q, "
        f"{a['rounds']} rounds) traced with `jax.profiler`; each XLA op's time on its thread "
        "put under the part of the round its named scope says (jaxspec_apps/bench/"
        "device_account.py). The program ran "
        f"{a['device_wall_s'] * 1e3 / a['rounds']:.1f} ms per round on the device (prefill "
        f"included); the host's time around it (the unprofiled call's wall less the device's) "
        f"was {a['host_s'] * 1e3:.1f} ms per call. The "
        "parts add up to both threads' busy time (XLA runs independent ops at once).",
        table("| part | ms per round | share of the round's busy time |", "|---|---:|---:|", parts),
    )


def programs_md(t: dict[str, Any]) -> list[str]:
    """The program_vs_parts table: each jitted program against its forwards timed alone."""
    rows = [
        f"| {x['program']} | {x['measured_s'] * 1e3:.2f} | {x['parts_s'] * 1e3:.2f} | "
        f"{x['parts']} | {x['ratio']:.2f} | "
        + ("" if x["host_s"] is None else f"{x['host_s'] * 1e3:.2f}")
        + " |"
        for x in t["rows"]
    ]
    return part(
        "### Each program against its parts (`program_vs_parts`)",
        "Each jitted program of a mode timed beside the forwards it is made of, every forward "
        "timed alone at the program's shapes, all in turns in one process (jaxspec_apps/bench/"
        "programs.py). measured / parts above 1 is work that is not a forward (sampling, q, the "
        "rule, copies, dispatch, the result's transfer); host = the verifier's Python around its "
        "step (its tick), not in the step.",
        table(
            "| program | measured ms | parts ms | parts | measured / parts | host ms |",
            "|---|---:|---:|---|---:|---:|",
            rows,
        ),
    )


def stalls_md(r: dict[str, Any]) -> list[str]:
    """Where each edge session's wall time went (`SessionTrace.stalls`), as shares."""
    rows = (
        (
            f"| {name} | {m['rtt_ms']:g} | {m['depth']} | {m['s_per_token'] * 1e3:.1f} | ",
            m["stalls"],
        )
        for name, m in r["modes"].items()
        if "stalls" in m
    )
    return part(
        "### Where the edge sessions stall",
        "Each edge session's unprofiled run split by its own trace (`SessionTrace.stalls`): "
        "drafting kept or thrown away (rejected drafts; blocks a rejection made stale), "
        "waiting for an answer up to the verifier's step time, beyond it (round trip, "
        "queue, the answer's hop from the verifier's thread into the event loop), for stale "
        "answers, and the session's own host time (its Python, opening and closing). In "
        "pipelined mode every wait is a full pipeline (`depth` blocks in flight).",
        stalls_table("| mode | RTT ms | depth | ms/token | ", "|---|---:|---:|---:|", rows),
    )
