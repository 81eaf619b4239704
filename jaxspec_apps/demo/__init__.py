"""`jaxspec demo`: watch edge tenants draft against a cloud verifier, live in the terminal.

    jaxspec demo                                  # 3 tenants, pipelined, 50 ms RTT
    jaxspec demo --num-tenants 4 --mode sync --rtt-ms 100 --seconds 30
    jaxspec demo --verifier host:50051 --token $TOKEN  # a verifier that is already running

It starts a real verifier service (`python -m verify serve` on a free loopback port, serving
the target of the pair `--pair` picks: SmolLM2 when it can be had, else the shipped tiny pair)
unless `--verifier` names one, and N edge tenants in this process, each drafting with the
pair's W4A16 draft (none with `--gamma 0`) over its own gRPC channel behind a simulated WAN
link. The screen shows every tenant's text as it grows (accepted drafts, corrections, bonus
tokens, rejected drafts and drafts in flight in distinct styles), α, tokens/s and inter-token
latency; the verifier's rows per step, step time and queue depth; throughput over time.
Without a terminal it prints a plain summary instead. Ctrl-C stops it; the spawned verifier
never outlives the demo.

Before anything starts, every option is checked (exit status 2) and a `--verifier` is asked
for its Stats with the token (exit status 1, naming the address and the reason, when it is
unreachable, refuses the token or is draining): no draft is loaded or compiled for a verifier
that cannot be used. Its figures on screen are labelled this demo's own or verifier-wide.

The parts: `_options` (flags and checks), `_app` (the run end to end), `_run` (the tenants'
event loop), `_pair` (which pair), `_progress` (words for the waits), `_state` and `_render`
(the screen).
"""

from jaxspec_apps.demo._app import main, run, serve_args
from jaxspec_apps.demo._options import MAX_TENANTS, add_arguments, check_options
from jaxspec_apps.demo._progress import StageLines, resolve_pair_showing_progress

__all__ = [
    "MAX_TENANTS",
    "StageLines",
    "add_arguments",
    "check_options",
    "main",
    "resolve_pair_showing_progress",
    "run",
    "serve_args",
]
