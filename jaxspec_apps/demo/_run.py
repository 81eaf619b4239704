"""Running the demo: edge tenants as asyncio tasks against a verifier service.

    [--verifier: Stats] ─ load the W4A16 draft ─┬─ compile it on a stand-in ─┐
    verifier starting  ─────────────────────────┴─── wait for "serving" ─────┴─ Stats ─
                                                        N tenants + stats poller ── stop

A verifier named with `--verifier` is asked for its Stats before anything loads: one call
proves it is reachable and takes the token, so a wrong address or token fails in a second,
not after the draft has compiled. Stats is asked again just before the tenants start (waiting
while the verifier warms up): its figures are the baseline the screen's "since start" counts
are taken from.

Every tenant is one `edge.session.run_session` over its own gRPC channel (one device each),
behind a `DelayedEndpoint` that adds the simulated WAN round trip. One `Drafter` serves them
all: its state is per tenant. The draft model compiles while the verifier loads, on a stand-in
endpoint that takes the same shapes, so the first real round does not stall on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from edge.adaptive import AdaptiveGamma
from edge.client import GrpcEndpoint, check_verifier
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter, load_drafter
from edge.session import run_session
from edge.warmup import compile_drafter
from jaxspec.ckpts.checkpoint import load
from jaxspec.nn.model import Model
from jaxspec.nn.text import chat_prompt, encode_prompt
from jaxspec.protocol import DraftSpec, SessionConfig
from jaxspec_apps.demo._pair import resolve_pair
from jaxspec_apps.demo._progress import warmup_progress
from jaxspec_apps.demo._state import DemoSettings, DemoState, TenantView
from jaxspec_host.flags import draft_spec_from_args, sampling_from_args, token_from_args
from jaxspec_host.worker import in_thread

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n",
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def push(self, item):\n',
    "import os\n\n\ndef walk(top):\n",
    "def read_lines(path):\n",
    "class Timer:\n    def __enter__(self):\n",
    "def quicksort(items):\n",
    "def parse_args(argv=None):\n",
    "async def fetch(session, url):\n",
)
# The real pair (SmolLM2 + its distilled draft) answers chat questions, one of each kind the
# benchmarks measure: coding, explanation, summarization, math, rewriting.
CHAT_PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash table is and why lookups in it are fast.",
    "Summarize in two sentences: The Python standard library is very extensive, offering a "
    "wide range of facilities. It contains built-in modules that provide access to system "
    "functionality such as file I/O, as well as modules written in Python that provide "
    "standardized solutions for many problems that occur in everyday programming.",
    "A baker makes 24 rolls an hour for 6 hours and sells 100 of them. How many are left?",
    "Rewrite this sentence in simpler words: The committee postponed its deliberations "
    "pending the acquisition of further information.",
    "What are the main differences between a list and a tuple in Python?",
)
# A real base model (Gemma 3 270M: no chat template) continues text: prose and code openings.
COMPLETION_PROMPTS = (
    "The history of the printing press begins",
    "def quicksort(items):\n    ",
    "A hash table stores its entries in",
    "import json\n\n\ndef load_config(path):\n    ",
    "The water cycle describes how water",
    "class Stack:\n    def __init__(self):\n        ",
)
STATS_EVERY_S = 0.25
PROGRESS_EVERY_S = 2.0  # start-up words that only count on are repeated at most this often
CHECK_TIMEOUT_S = 10.0  # the first Stats call to a --verifier (an address that drops packets)
WAIT_SERVING_S = 300.0  # how long the tenants wait for a verifier that warms up
# How long a tenant waits for one answer from a verifier spawned with --no-warmup: its first
# block of each batch shape waits for that shape's compile (the default is GrpcEndpoint's).
LAZY_RESULT_TIMEOUT_S = 180.0


@dataclasses.dataclass
class DemoResult:
    """What a run leaves behind (the CLI prints it; tests check it)."""

    state: DemoState
    interrupted: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)


def default_prompts(args: argparse.Namespace) -> tuple[str, ...]:
    """`--prompt`s, else the pair's kind: chat questions (SmolLM2), completions (a real base
    model: Gemma), code openings (the tiny pair)."""
    if args.prompt:
        return tuple(args.prompt)
    if getattr(args, "chat", False):
        return CHAT_PROMPTS
    return COMPLETION_PROMPTS if getattr(args, "completion", False) else DEFAULT_PROMPTS


def _prompts(args: argparse.Namespace) -> list[str]:
    given = default_prompts(args)
    return [given[i % len(given)] for i in range(args.tenants)]


def _configs(
    args: argparse.Namespace, state: DemoState, text: Model, spec: DraftSpec
) -> list[SessionConfig]:
    """Each tenant's session (prompt, seed), its prompt encoded by `text` (the draft, or the
    target with --gamma 0); teaches the views to decode token ids. ValueError when a prompt
    and --max-new-tokens do not fit the model's context (`check_context`)."""

    tok = text.tokenizer

    def decode(ids: list[int]) -> str:
        if tok is None:  # a checkpoint without a tokenizer: show the ids
            return "".join(f" {i}" for i in ids)
        return tok.decode(ids, skip_special_tokens=True)

    # --temperature (the demo's one sampling flag): the settings `check_args` made
    sampling = getattr(args, "sampling", None) or sampling_from_args(args)
    configs = []
    for i, view in enumerate(state.tenants):
        view.decode = decode
        configs.append(
            SessionConfig(
                prompt=(chat_prompt if args.chat else encode_prompt)(text, view.prompt_text),
                max_new_tokens=args.max_new_tokens,
                sampling=sampling,
                seed=args.seed + i,
                mode=args.mode,
                draft=spec,
            )
        )
    check_context(text, configs)
    return configs


def check_context(model: Model, configs: Sequence[SessionConfig]) -> None:
    """Every tenant's prompt plus --max-new-tokens within `model`'s context (its
    max_position_embeddings; the draft's and the target's are the same in both pairs), or a
    ValueError naming the limit: a tenant would otherwise fail only when its session runs
    past the end, minutes later."""
    limit = model.config.max_position_embeddings
    for i, cfg in enumerate(configs):
        need = len(cfg.prompt) + cfg.max_new_tokens
        if need > limit:
            raise ValueError(
                f"tenant {i + 1}'s prompt ({len(cfg.prompt)} tokens) + --max-new-tokens "
                f"{cfg.max_new_tokens} = {need} exceeds the context of {model.name or 'the model'}"
                f": max_position_embeddings = {limit}"
            )


# The screen's settings that are the command line's options as they are.
SETTINGS_FROM_ARGS = (
    "tenants", "mode", "gamma", "rtt_ms", "jitter_ms", "temperature", "max_new_tokens",
    "seconds", "checkpoint", "draft", "quantize",
)  # fmt: skip


def make_state(args: argparse.Namespace, address: str = "", pid: int | None = None) -> DemoState:
    """The screen's initial contents from the command line (the pair resolved first)."""
    resolve_pair(args)
    settings = DemoSettings(
        **{name: getattr(args, name) for name in SETTINGS_FROM_ARGS},
        depth=1 if args.mode == "sync" else args.depth,
        verifier=address,
        spawned=args.verifier is None,
        verifier_pid=pid,
    )
    views = [
        TenantView(index=i, prompt_text=p, max_new_tokens=args.max_new_tokens)
        for i, p in enumerate(_prompts(args))
    ]
    return DemoState(settings=settings, tenants=views)


async def run_demo(
    args: argparse.Namespace,
    state: DemoState,
    wait_address: Callable[[], Awaitable[str]],
    *,
    on_phase: Callable[[str], None] | None = None,
    on_end: Callable[[], None] | None = None,
    verifier_log: Callable[[], Sequence[str]] | None = None,
) -> DemoResult:
    """Load the draft, wait for the verifier (`await wait_address()` gives its host:port
    once it serves), run the tenants until they finish, `--seconds` pass or the task is
    cancelled (Ctrl-C); sessions and channels are closed before returning.

    `verifier_log()` (a spawned verifier's output lines so far) lets the start-up words say
    how far its warm-up is ("compiling its batch shapes 5/28"); `on_phase` hears every new
    start-up text (repeats at most every `PROGRESS_EVERY_S`) and each tenant's first tokens.
    """

    words = _StartupWords(state, asyncio.get_running_loop(), on_phase, verifier_log)
    token = token_from_args(args)
    watch = None
    if not state.settings.spawned:  # the verifier first (a second), then the draft (tens of s)
        await _check_named_verifier(args, token, words)
        watch = asyncio.ensure_future(_watch_named_verifier(args, token, words))
    try:
        drafter, configs, address = await _load_draft_while_the_verifier_starts(
            args, state, wait_address, words
        )
    finally:
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    with state.lock:
        state.settings.verifier = address
    endpoints, monitor = await _connect(args, state, address, token, words)
    result = DemoResult(state=state)
    tenants = _Tenants(args, state, drafter, configs, endpoints, monitor, result, on_phase)
    await tenants.run(words, on_end)
    return result


@dataclasses.dataclass
class _StartupWords:
    """What the screen says while the run starts (`DemoState.phase` and `.detail`), and what
    `on_phase` hears: every new text, and while a wait goes on (`tick`) the words again
    every `PROGRESS_EVERY_S` with the seconds since the command started, so a plain log moves
    every 2 s but is not flooded with "compiling 5/28, 6/28, ...".
    While a spawned verifier is not serving yet, its own progress is added to the words."""

    state: DemoState
    loop: asyncio.AbstractEventLoop
    on_phase: Callable[[str], None] | None = None
    verifier_log: Callable[[], Sequence[str]] | None = None
    address: asyncio.Future[str] | None = None  # the verifier's host:port once it serves
    remote: tuple[int, int] | None = None  # a --verifier's warm-up (done, total), from Stats
    said: str = ""  # the last text `on_phase` heard, and when (the loop's clock)
    said_t: float = float("-inf")
    step: str = ""  # what the demo itself is doing while the verifier starts

    def phase(self, word: str, detail: str = "", *, tick: bool = False) -> None:
        """Show `word` (the phase) and `detail` on screen; tell `on_phase` if it is new."""
        with self.state.lock:
            self.state.phase, self.state.detail = word, detail
        text, now = detail or word, self.loop.time()
        if self.on_phase is None:
            return
        if (not tick and text != self.said) or (tick and now - self.said_t >= PROGRESS_EVERY_S):
            self.said, self.said_t = text, now
            self.on_phase(f"{text} ({self.state.elapsed_s():.0f} s)" if tick else text)

    def starting(self, text: str | None = None, *, tick: bool = False) -> None:
        """The "starting" phase: the demo's own step (`text`, else the last one), with the
        spawned verifier's progress while it is not serving yet."""
        if text is not None:
            self.step = text
        words = self.step
        waiting = self.address is not None and not self.address.done()
        counts = self.remote
        if self.state.settings.spawned and waiting:
            log = self.verifier_log
            counts = warmup_progress(log()) if log is not None else None
            if counts is None:
                words += "; the verifier is loading its target"
        if counts is not None and counts[1]:
            words += f"; the verifier is compiling its batch shapes {counts[0]}/{counts[1]}"
        self.phase("starting", words + "…", tick=tick)

    async def keep_ticking(self) -> None:
        """Refresh the start-up words twice a second (the verifier's count moves on its own)."""
        while True:
            await asyncio.sleep(0.5)
            self.starting(tick=True)


async def _check_named_verifier(
    args: argparse.Namespace, token: str | None, words: _StartupWords
) -> None:
    """Ask a `--verifier` for its Stats before the draft loads: a wrong address or token
    fails in a second, not after tens of seconds of loading and compiling. Warming up is
    fine here: the tenants wait for it to serve (`_connect`)."""
    words.phase("starting", f"checking the verifier {args.verifier}…")
    async with GrpcEndpoint(args.verifier, token=token, timeout_s=CHECK_TIMEOUT_S) as ep:
        words.remote = _warming(await check_verifier(ep, serving=False))


def _warming(stats: dict) -> tuple[int, int] | None:
    """A verifier's warm-up count (done, total) from its Stats; None once it serves."""
    if stats.get("serving", True):
        return None
    return int(stats.get("warming_done", 0)), int(stats.get("warming_total", 0))


async def _watch_named_verifier(
    args: argparse.Namespace, token: str | None, words: _StartupWords
) -> None:
    """While the draft loads: ask a `--verifier` that is warming up for its Stats every
    second, so the start-up words count its shapes as they compile (what a spawned
    verifier's log tells); ends once it serves. A failed call is left to `_connect`."""
    async with GrpcEndpoint(args.verifier, token=token, timeout_s=CHECK_TIMEOUT_S) as ep:
        while words.remote is not None:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                words.remote = _warming(await ep.stats())


async def _load_draft_while_the_verifier_starts(
    args: argparse.Namespace,
    state: DemoState,
    wait_address: Callable[[], Awaitable[str]],
    words: _StartupWords,
) -> tuple[Drafter | None, list[SessionConfig], str]:
    """Load and compile the draft (in worker threads that a Ctrl-C does not wait for) while
    the verifier starts; the drafter (None with --gamma 0: only the target's tokenizer is
    needed), each tenant's session and the verifier's address once it serves."""
    s, spec = state.settings, draft_spec_from_args(args)
    words.address = address = asyncio.ensure_future(wait_address())
    ticker = asyncio.ensure_future(words.keep_ticking())
    try:
        drafter = None
        if spec.speculative:
            words.starting(f"loading the {s.quantize.upper()} draft {s.draft}")
            drafter = await in_thread(load_drafter, args.draft, args.quantize, spec)
            configs = _configs(args, state, drafter.model, spec)
            words.starting("compiling the draft model")
            await in_thread(compile_drafter, drafter, configs, s.depth)
        else:  # --gamma 0: speculation off, nothing drafts; the target's tokenizer only
            words.starting(f"loading {s.checkpoint} for its tokenizer (--gamma 0: nothing drafts)")
            configs = _configs(args, state, await in_thread(load, args.checkpoint), spec)
        if not address.done():
            words.starting("draft ready; waiting for the verifier")
        return drafter, configs, await address
    finally:
        address.cancel()
        ticker.cancel()


async def _connect(
    args: argparse.Namespace,
    state: DemoState,
    address: str,
    token: str | None,
    words: _StartupWords,
) -> tuple[list[GrpcEndpoint], GrpcEndpoint]:
    """A channel per tenant and one for the Stats poller, once the verifier serves (waited
    for up to `WAIT_SERVING_S`); its Stats then are the baseline this demo's own figures are
    counted from. A verifier spawned with --no-warmup gets a longer per-call deadline."""
    lazy = args.verifier is None and not args.warmup
    kw = dict(token=token) | (dict(timeout_s=LAZY_RESULT_TIMEOUT_S) if lazy else {})
    endpoints = [GrpcEndpoint(address, **kw) for _ in state.tenants]
    monitor = GrpcEndpoint(address, **kw)
    try:
        state.set_baseline(
            await check_verifier(
                monitor,
                retry_s=WAIT_SERVING_S,
                on_retry=lambda notice: words.phase("starting", f"{notice}…"),
                on_wait=lambda wait: words.phase("starting", f"{wait}…", tick=True),
            )
        )
    except BaseException:
        await _close([*endpoints, monitor], Exception)
        raise
    return endpoints, monitor


async def _close(endpoints: Sequence[GrpcEndpoint], *ignore: type[BaseException]) -> None:
    """Close every channel, each one's `ignore`d errors left unraised."""
    for ep in endpoints:
        with contextlib.suppress(*ignore):
            await ep.aclose()


@dataclasses.dataclass
class _Tenants:
    """The running demo: one task per tenant (each its own channel behind a simulated WAN
    link, one sample after another with `--seconds`) and a poller of the verifier's Stats."""

    args: argparse.Namespace
    state: DemoState
    drafter: Drafter | None  # None with --gamma 0
    configs: list[SessionConfig]  # tenant i's first sample
    endpoints: list[GrpcEndpoint]  # tenant i's channel
    monitor: GrpcEndpoint  # the Stats poller's channel
    result: DemoResult
    on_phase: Callable[[str], None] | None = None
    stopping: bool = False  # set when the run ends: no tenant starts another sample

    async def run(self, words: _StartupWords, on_end: Callable[[], None] | None) -> None:
        """Run the tenants until they finish, `--seconds` pass or this task is cancelled
        (Ctrl-C, SIGTERM: the screen is kept), then stop them and close every channel."""
        words.phase("running")
        tasks = [asyncio.ensure_future(self.tenant(i)) for i in range(len(self.state.tenants))]
        poller = asyncio.ensure_future(self.poll_stats())
        try:
            timeout = self.args.seconds if self.args.seconds > 0 else None
            await asyncio.wait(tasks, timeout=timeout)
            words.phase("done" if all(t.done() for t in tasks) else "time is up")
        except asyncio.CancelledError:
            self.result.interrupted = True
            asyncio.current_task().uncancel()
            words.phase("interrupted")
        finally:
            if on_end is not None:  # the screen as the run ends, drafts in flight included
                on_end()
            await self.stop(tasks, poller)

    async def stop(self, tasks: list[asyncio.Future[None]], poller: asyncio.Future[None]) -> None:
        """Stop every tenant and the poller, take the verifier's last Stats, close channels."""
        # The sessions close in run_session's `finally`. A cancellation can be lost (on
        # Python 3.11 `asyncio.wait_for` returns a result that arrives together with the
        # cancel), so cancel until every tenant has stopped.
        self.stopping = True
        pending = set(tasks)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            self.state.set_stats(await asyncio.wait_for(self.monitor.stats(), 2.0))
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(poller, return_exceptions=True)
        await _close([*self.endpoints, self.monitor], Exception, asyncio.CancelledError)

    async def tenant(self, i: int) -> None:
        """Tenant i from start to end; its failure is shown on its row, the others go on."""
        view = self.state.tenants[i]
        try:
            await self._samples(i)
            with self.state.lock:
                view.finish("stopped" if self.stopping else "done")
        except asyncio.CancelledError:
            with self.state.lock:
                view.finish("stopped" if view.status == "drafting" else view.status)
            raise
        except Exception as e:
            msg = f"{getattr(e, 'code', type(e).__name__)}: {e}"
            self.result.errors.append(f"edge {i + 1}: {msg}")
            with self.state.lock:
                view.finish("error", msg)

    async def _samples(self, i: int) -> None:
        """Tenant i's samples: one, or with `--seconds` a fresh one with the next seed each
        time one ends, until the run stops."""
        view, cfg = self.state.tenants[i], self.configs[i]
        sample = 0
        while True:
            if sample:
                cfg = dataclasses.replace(cfg, seed=cfg.seed + len(self.state.tenants))
            with self.state.lock:
                view.start_sample(cfg.prompt)
            await self._sample(i, cfg)
            sample += 1
            if self.args.seconds <= 0 or self.stopping:
                break

    async def _sample(self, i: int, cfg: SessionConfig) -> None:
        """One session of tenant i over its channel behind a simulated link."""
        depth = self.state.settings.depth
        # A fresh simulated link per session: a DelayedEndpoint whose message was cancelled
        # mid-flight (blocks still in flight when a session ends) would hold every later
        # message of that direction behind it.
        one_way, jitter = self.args.rtt_ms / 2e3, self.args.jitter_ms / 2e3
        ep = DelayedEndpoint(self.endpoints[i], one_way_s=one_way, jitter_s=jitter, seed=cfg.seed)
        on_event = self._on_event(i)
        # --gamma auto: each block's length from what this session measures.
        policy = AdaptiveGamma(cfg.draft.gamma, cfg.mode, depth) if cfg.draft.adaptive else None
        await run_session(ep, self.drafter, cfg, depth=depth, on_event=on_event, block_len=policy)

    def _on_event(self, i: int) -> Callable[[str, tuple[int, ...]], None]:
        """Tenant i's session events into its view; `on_phase` hears its first tokens."""
        view = self.state.tenants[i]

        def on_event(kind: str, toks: tuple[int, ...]) -> None:
            with self.state.lock:
                first = view.tokens == 0
                view.on_event(kind, toks)
                first = first and view.tokens > 0
            if first and self.on_phase is not None:
                t = self.state.elapsed_s()
                self.on_phase(f"edge {i + 1}: first tokens {t:.1f} s after start")

        return on_event

    async def poll_stats(self) -> None:
        """The verifier's Stats every `STATS_EVERY_S`, and this demo's throughput sample."""
        while True:
            try:
                self.state.set_stats(await self.monitor.stats())
            except Exception as e:
                self.state.set_stats(None, f"stats unavailable: {e}")
            self.state.sample_throughput()
            await asyncio.sleep(STATS_EVERY_S)
