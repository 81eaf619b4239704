"""Running `jaxspec demo` end to end: the verifier it spawns (or the one `--verifier` names),
the live dashboard or plain lines, the event loop of the tenants, and the exits: Ctrl-C,
SIGTERM and SIGHUP end the run early, and a spawned verifier never outlives it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys

from rich.console import Console
from rich.live import Live

from jaxspec.compilation.shapes import bucket
from jaxspec.protocol import VerifierError
from jaxspec_apps.demo._options import check_options
from jaxspec_apps.demo._progress import resolve_pair_showing_progress
from jaxspec_apps.demo._render import Dashboard, save_capture, summary
from jaxspec_apps.demo._run import DemoResult, default_prompts, make_state, run_demo
from jaxspec_apps.demo._state import DemoState
from jaxspec_host.flags import AUTO, interrupted, refused_line, use_compilation_cache
from verify.process import VerifierProcess


def serve_args(args: argparse.Namespace) -> list[str]:
    """The spawned verifier's flags: one KV slot per tenant, the demo's gamma, enough length
    for the longest prompt (bytes bound its tokens) plus --max-new-tokens, the demo's
    compilation cache when one is named."""
    prompts = default_prompts(args)
    template = 64 if args.chat else 1  # the chat template's system turn and markers; BOS
    need = max(len(p.encode()) for p in prompts) + template + args.max_new_tokens + 16
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

    check_options(args)
    live = console.is_terminal if live is None else live
    notice = resolve_pair_showing_progress(args, console, live)
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

    check_options(args)  # a bad option: ValueError (the CLI's exit 2) before anything runs
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
