"""The `openai` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.render.tables import Page


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    """The "OpenAI-compatible endpoint" section of BENCHMARKS.md."""
    o, c = r["overhead"], r["concurrent"]
    return f"""## The OpenAI-compatible endpoint

Measured by `{r["command"]}` on this machine ({r["cpus"]} cores, load average
{r["load_before"]:.1f} before, {r["load_after"]:.1f} after: other jobs ran; the verifier, the
endpoint and the clients share the cores). One verifier (`python -m verify serve`, the
shipped tiny target) and one `python -m edge serve` (the shipped draft at W4A16, gamma 4,
pipelined, full q) on loopback.

{lines(r)[0]}

{lines(r)[1]}

Per-token overhead: a request's wall time / its {o["tokens"]} tokens, for the same greedy
request run as an edge session in the benchmark's process (what `python -m edge generate`
runs, over one kept channel) and through the endpoint, streamed over HTTP and read to
`[DONE]` (the texts are checked equal); {r["repeats"]} pairs run back to back after a
warm-up. On these shared cores a single pair moves by tens of percent either way, so the
wall-time figures say only that the overhead is within that noise; the edge-side CPU time
(the session's process against the endpoint's server process, summed over the pairs) is the
steadier figure: the endpoint's own work (HTTP, JSON, detokenizing, SSE) per streamed
chunk. The tiny draft costs about 2 ms of CPU per token, so that work is a visible fraction
here and a small one next to a real draft's tens of ms per token.

The {c["clients"]} clients are concurrent streams (seeds 0..{c["clients"] - 1}, T = 1, the
same prompt; seed 0's text is checked equal to its run alone). One edge process drafts for
all of them on one event loop and the tiny verifier is compute-bound on the same 2 cores, so
the aggregate does not rise above one client's rate here; with the draft on a device and the
verifier remote, the sessions' round trips overlap instead.""".split("\n")


def lines(r: dict[str, Any]) -> tuple[str, str]:
    """The two result lines."""
    o, c = r["overhead"], r["concurrent"]
    first = (
        f"endpoint vs edge generate ({o['tokens']} tokens, greedy, tiny pair, gamma 4 "
        f"pipelined): best {o['edge_ms']:.2f} vs {o['api_ms']:.2f} ms/token "
        f"(**{o['api_ms'] / o['edge_ms'] - 1:+.1%}**); median of {len(o['ratios'])} "
        f"back-to-back pairs' ratios **{o['overhead']:+.1%}** (pairs: "
        f"{', '.join(f'{x - 1:+.0%}' for x in o['ratios'])}; goal <= 5%); edge-side CPU "
        f"{o['edge_cpu_ms']:.2f} vs {o['api_cpu_ms']:.2f} ms/token "
        f"(**{o['api_cpu_ms'] / o['edge_cpu_ms'] - 1:+.1%}**)"
    )
    second = (
        f"{c['clients']} concurrent streaming clients on one verifier: {c['total_tokens']} "
        f"tokens in {c['wall_s']:.2f} s, {c['aggregate_tps']:.1f} tok/s = "
        f"**{c['aggregate_tps'] / c['one_tps']:.2f}x** one client alone ({c['one_tps']:.1f} "
        f"tok/s); first chunk p50 {c['first_p50_s'] * 1e3:.0f} ms (alone "
        f"{c['first_alone_s'] * 1e3:.0f} ms)"
    )
    return first, second
