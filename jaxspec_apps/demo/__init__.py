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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from edge.client import channel_target
from jaxspec.compilation.shapes import bucket
from jaxspec.protocol import VerifierError
from jaxspec_apps.demo._pair import needs_fetch, resolve_pair
from jaxspec_apps.demo._progress import StageLines, describe
from jaxspec_apps.demo._render import Dashboard, save_capture, summary
from jaxspec_apps.demo._run import DemoResult, default_prompts, make_state, run_demo
from jaxspec_apps.demo._state import DemoState
from jaxspec_host.flags import (
    AUTO,
    HelpFormatter,
    add_cache_flag,
    add_client_flags,
    add_max_new_tokens,
    add_model_flags,
    add_sampling_flags,
    add_speculation_flags,
    check_args,
    interrupted,
    refuse_draft_without_speculation,
    refused_line,
    use_compilation_cache,
)
from jaxspec_host.pairs import REAL_PAIRS, SMOLLM2_PAIR, fetch_notice
from verify.process import VerifierProcess

MAX_TENANTS = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `jaxspec demo` options (the CLI calls this while building its parser), in the
    order `--help` lists them."""
    p.description = "Live view of edge tenants drafting against a verifier service."
    p.formatter_class = HelpFormatter
    _add_tenant_flags(p)
    _add_generation_flags(p)
    _add_verifier_flags(p)
    _add_output_flags(p)


def _add_tenant_flags(p: argparse.ArgumentParser) -> None:
    """How many tenants, how they draft, and the simulated link between them and the verifier."""
    p.add_argument(
        "--num-tenants",
        dest="tenants",
        metavar="N",
        type=int,
        default=3,
        help="edge tenants, each its own session and channel (`--tenants` of `python -m verify "
        "serve` is its tenants file, a different thing)",
    )
    add_speculation_flags(p, q_dtype=None, encoding=False)  # --gamma ... --depth
    add_cache_flag(p)
    p.add_argument("--rtt-ms", type=float, default=50.0, help="simulated round trip in ms")
    p.add_argument("--jitter-ms", type=float, default=5.0, help="± on the round trip in ms")


def _add_generation_flags(p: argparse.ArgumentParser) -> None:
    """What each tenant samples: sampling values, prompts, length, and for how long."""
    add_sampling_flags(
        p,
        temperature=0.7,
        top_k=None,
        top_p=None,
        min_p=None,
        logit_bias=None,
        helps={"seed": "tenant i samples with seed + i"},
    )
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="prompt (repeat for several; tenants take them in turn); default: chat questions "
        "with SmolLM2, prose and code openings with Gemma, Python code with the tiny pair",
    )
    add_max_new_tokens(p, 160, dest="tokens", what=" per tenant and sample")
    p.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="generate for this long once started, each tenant beginning a new sample (next "
        "seed) when one ends; 0 (default): one sample per tenant, then stop",
    )


def _add_verifier_flags(p: argparse.ArgumentParser) -> None:
    """Which verifier (a running one, or one spawned with which target), and the draft."""
    add_client_flags(p, "demo")  # --verifier (none: one is spawned), --token
    add_model_flags(p, "demo")  # --checkpoint --draft --pair --quantize
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the spawned verifier compiles every batch shape of its pool (one slot per "
        "tenant) before serving (default; the tenants start together, so they need them at "
        "once); --no-warmup compiles each on first use (requests stall on each new shape)",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the run is shown: live or a plain summary, and screen captures."""
    p.add_argument("--plain", action="store_true", help="no live view: print a summary at the end")
    p.add_argument(
        "--capture",
        action="append",
        default=None,
        metavar="FILE",
        help="save the screen as the run ends: SVG for a .svg name, else text "
        "(the terminal's size; 80x24 without one); repeatable",
    )


def _check(args: argparse.Namespace) -> None:
    """Refuse nonsense before anything starts (the CLI prints ValueErrors cleanly)."""
    check_args(args)  # sampling values, seed, depth, the DraftSpec: the library's validators
    refuse_draft_without_speculation(args)
    if not 1 <= args.tenants <= MAX_TENANTS:
        raise ValueError(f"--num-tenants must be in [1, {MAX_TENANTS}], got {args.tenants}")
    if args.gamma != AUTO and not 0 <= args.gamma <= 16:
        raise ValueError("--gamma must be in [0, 16] (0: speculation off) or auto")
    if args.depth < 1:
        raise ValueError("--depth must be >= 1")
    if args.tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.tokens}")
    if args.rtt_ms < 0 or args.jitter_ms < 0 or args.jitter_ms > args.rtt_ms:
        raise ValueError("--rtt-ms and --jitter-ms must be >= 0, jitter at most the RTT")
    if args.seconds < 0:
        raise ValueError("--seconds must be >= 0")
    if args.prompt is not None and not all(p for p in args.prompt):
        raise ValueError("--prompt must not be empty")
    if args.verifier is not None:
        channel_target(args.verifier)  # a malformed address, a port outside [1, 65535]


def serve_args(args: argparse.Namespace) -> list[str]:
    """The spawned verifier's flags: one KV slot per tenant, the demo's gamma, enough length
    for the longest prompt (bytes bound its tokens) plus --tokens, the demo's compilation
    cache when one is named."""
    prompts = default_prompts(args)
    template = 64 if args.chat else 1  # the chat template's system turn and markers; BOS
    need = max(len(p.encode()) for p in prompts) + template + args.tokens + 16
    max_len = bucket(need, 512)
    out = ["--checkpoint", args.checkpoint, "--max-sessions", str(args.tenants)]
    longest = args.longest_block if args.gamma == AUTO else max(args.gamma, 1)  # gamma 0: 1
    out += ["--max-gamma", str(longest), "--max-len", str(max_len), "--drain-timeout-s", "2"]
    out += ["--drain-min-s", "0"]  # no health checker watches the demo's own verifier drain
    out += ["--kv-buckets", str(max_len)]  # one KV bucket: half the shapes to compile first
    if args.compilation_cache is not None:
        out += ["--compilation-cache", args.compilation_cache]
    # The tenants start together, so the first steps already batch every tenant's rows: the
    # verifier compiles its whole (small) pool before it serves rather than making the first
    # blocks wait for the largest row bucket (a wait past the edge's per-call deadline under
    # load: measured).
    return [*out, "--full-warmup"] if args.warmup else [*out, "--no-warmup"]


def run(
    args: argparse.Namespace,
    console: Console,
    *,
    live: bool | None = None,
    state: DemoState | None = None,
) -> DemoResult:
    """Run the demo on `console`; what the tenants did (`DemoResult`).

    `live` (default: whether the console is a terminal) draws the dashboard with rich.live;
    otherwise only plain progress lines are printed. `state` (from `_run.make_state(args)`)
    lets a caller watch the run from another thread. Ctrl-C, SIGTERM and SIGHUP end the run
    early (`interrupted`); whatever happens, a spawned verifier is stopped before this
    returns.
    """

    _check(args)
    live = console.is_terminal if live is None else live
    notice = _resolve_pair_showing_progress(args, console, live)
    if notice is not None:
        console.print(f"jaxspec demo: {notice}", highlight=False)
    if state is None:
        state = make_state(args)
    result = DemoResult(state=state, interrupted=True)  # unless the run ends by itself
    try:
        with contextlib.ExitStack() as stack:
            _raise_on_termination(stack)
            result = _run_to_the_end(_DemoRun(args, console, live, state), stack)
    except KeyboardInterrupt:  # before or after the event loop, or a second Ctrl-C
        _interrupted(state)
    return result


@dataclasses.dataclass
class _DemoRun:
    """One `run`: its options, the console it shows on (live or plain lines), the screen's
    state, and the verifier it spawned (None with `--verifier`)."""

    args: argparse.Namespace
    console: Console
    live: bool
    state: DemoState
    server: VerifierProcess | None = None

    def start_verifier(self, stack: contextlib.ExitStack) -> None:
        """Spawn the verifier (stopped when `stack` closes) unless `--verifier` names one."""
        if self.args.verifier is None:
            self.server = server = stack.enter_context(VerifierProcess(serve_args(self.args)))
            self.state.settings.verifier_pid = server.pid
            self.state.detail = "starting the verifier…"
            self.on_phase(f"verifier pid {server.pid} starting")
        else:
            self.state.settings.verifier = self.args.verifier
            self.state.detail = f"connecting to {self.args.verifier}…"

    def on_phase(self, text: str) -> None:
        """Start-up words as plain lines; the live screen shows them itself."""
        if not self.live:
            self.console.print(f"jaxspec demo: {text}", highlight=False)

    def capture(self) -> None:
        """Save the screen as the run ends (`--capture`), at the terminal's size or 80x24."""
        if self.args.capture:
            width, height = (self.console.width, self.console.height) if self.live else (80, 24)
            for path in self.args.capture:
                save_capture(self.state, path, width, height)

    async def address(self) -> str:
        """The verifier's host:port: `--verifier`'s, or the spawned one's once it listens."""
        if self.server is None:
            return self.args.verifier
        while (addr := self.server.ready_address()) is None:
            await asyncio.sleep(0.05)
        return addr

    async def run_async(self) -> DemoResult:
        """`run_demo` in the event loop, SIGTERM and SIGHUP cancelling it as Ctrl-C does."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
        server = self.server
        try:
            return await run_demo(
                self.args,
                self.state,
                self.address,
                on_phase=self.on_phase,
                on_end=self.capture,
                verifier_log=None if server is None else lambda: server.lines,
            )
        except asyncio.CancelledError:  # stopped before the tenants ran
            task.uncancel()
            _interrupted(self.state)
            return DemoResult(state=self.state, interrupted=True)


def _run_to_the_end(run: _DemoRun, stack: contextlib.ExitStack) -> DemoResult:
    """The verifier started (or named), the dashboard up when live, then the event loop
    until the run ends; `stack` stops the verifier and the dashboard afterwards."""
    run.start_verifier(stack)
    if run.live:
        dashboard = Dashboard(run.state)
        stack.enter_context(
            Live(dashboard, console=run.console, refresh_per_second=8, transient=False)
        )
    try:
        return asyncio.run(run.run_async())
    except KeyboardInterrupt:
        _interrupted(run.state)
        raise
    finally:
        _raise_on_termination(stack)  # the event loop left SIGTERM at its default


def _interrupted(state: DemoState) -> None:
    """The screen says the run was interrupted."""
    with state.lock:
        state.phase = "interrupted"


def _resolve_pair_showing_progress(
    args: argparse.Namespace, console: Console, live: bool
) -> str | None:
    """`resolve_pair`, with the fetch (bytes), conversion and W4A16 build shown as they go
    when there is anything to fetch or build: bars in a terminal, else a line every 2 s."""
    if not needs_fetch(args):
        return resolve_pair(args)
    notice = fetch_notice(draft=args.gamma != 0, choice=args.pair)
    console.print(f"jaxspec demo: {notice}", highlight=False)
    if not live:
        lines = StageLines(lambda text: console.print(f"jaxspec demo: {text}", highlight=False))
        with lines.ticking():  # the words again every 2 s while no progress call comes
            return resolve_pair(args, lines)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
    ) as bars:
        # A row whose clock runs until the end: it moves between stages too.
        label = REAL_PAIRS.get(args.pair, SMOLLM2_PAIR).label
        overall = bars.add_task(f"getting {label} and its W4A16 draft", total=None)
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(describe(stage, done, total), total=total)
            bars.update(
                tasks[stage], completed=done, total=total, description=describe(stage, done, total)
            )
            bars.refresh()  # drawn now, not at the next tick of a thread the work may starve

        notice = resolve_pair(args, progress)
        bars.update(overall, total=1, completed=1)  # its clock stops: done
        return notice


def _raise_on_termination(stack: contextlib.ExitStack) -> None:
    """SIGTERM/SIGHUP act like Ctrl-C (clean exit, server stopped) outside the event loop,
    which installs its own handlers while it runs."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            old = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            continue
        stack.callback(signal.signal, sig, old)


def main(args: argparse.Namespace) -> int:
    """`jaxspec demo`: 0 when every tenant finished, 130 after Ctrl-C, 1 on a failure (the
    verifier unusable or not starting, a tenant's error); a bad option is 2 (the CLI)."""

    _check(args)  # a bad option is a ValueError: the CLI's exit status 2, before anything runs
    use_compilation_cache(args)  # the draft's compiled steps, for the next start
    console = Console()
    live = console.is_terminal and not args.plain
    try:
        result = run(args, console, live=live)
    except VerifierError as e:  # --verifier unreachable, token refused, draining
        print(refused_line("jaxspec demo", e), file=sys.stderr)
        return 1
    except RuntimeError as e:  # the verifier did not start
        print(f"jaxspec demo: error: {e}", file=sys.stderr)
        return 1
    # The plain summary in every mode: under the final live frame, or after the progress lines.
    console.print(summary(result.state), highlight=False)
    for err in result.errors:
        print(f"jaxspec demo: {err}", file=sys.stderr)
    if result.interrupted:
        return interrupted("jaxspec demo")  # 130
    return 1 if result.errors else 0
