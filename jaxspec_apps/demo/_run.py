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
import os
from collections.abc import Awaitable, Callable, Sequence

from edge.adaptive import AdaptiveGamma
from edge.client import GrpcEndpoint, check_verifier
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter, load_drafter
from edge.session import run_session
from jaxspec.protocol import DraftBlock, SessionConfig, SessionInfo, VerifyResult
from jaxspec.text import chat_prompt, encode_prompt
from jaxspec_apps.demo._pair import resolve_pair
from jaxspec_apps.demo._progress import warmup_progress
from jaxspec_apps.demo._state import DemoSettings, DemoState, TenantView
from jaxspec_host.flags import draft_spec_from_args

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


class _StandIn:
    """A verifier stand-in for compiling the drafter: it accepts every draft but the last,
    answers a correction and finishes after two rounds, so `run_session` traces the same
    draft/rollback/append shapes a real session will."""

    def __init__(self) -> None:
        self.rounds = 0

    async def open_session(self, config: SessionConfig) -> SessionInfo:

        return SessionInfo(
            session_id="warmup",
            max_gamma=config.draft.gamma,
            max_sparse_k=0,
            vocab_size=0,
            max_new_tokens=config.max_new_tokens,
        )

    async def verify(self, block: DraftBlock) -> VerifyResult:

        self.rounds += 1
        a = len(block.tokens) - 1
        return VerifyResult(
            epoch=block.epoch,
            start=block.start,
            accepted=a,
            tokens=(*block.tokens[:a], block.tokens[0]),
            next_token=block.tokens[0],
            new_epoch=block.epoch + 1,
            stale=False,
            finished=self.rounds >= 2,
        )

    async def close_session(self, session_id: str) -> None:
        pass


def _compile_drafter(drafter: Drafter, configs: list[SessionConfig], depth: int) -> None:
    """Run a session of each prompt length once against the stand-in (in a worker thread,
    with its own event loop): every shape the tenants will use is compiled."""

    for cfg in {len(cfg.prompt): cfg for cfg in configs}.values():
        asyncio.run(run_session(_StandIn(), drafter, cfg, depth=depth))


def _prompts(args: argparse.Namespace) -> list[str]:
    given = args.prompt or list(CHAT_PROMPTS if getattr(args, "chat", False) else DEFAULT_PROMPTS)
    return [given[i % len(given)] for i in range(args.tenants)]


def _configs(args: argparse.Namespace, state: DemoState, drafter: Drafter) -> list[SessionConfig]:
    """Each tenant's session (prompt, seed); teaches the views to decode token ids."""

    tok = drafter.model.tokenizer

    def decode(ids: list[int]) -> str:
        if tok is None:  # a checkpoint without a tokenizer: show the ids
            return "".join(f" {i}" for i in ids)
        return tok.decode(ids, skip_special_tokens=True)

    configs = []
    for i, view in enumerate(state.tenants):
        view.decode = decode
        configs.append(
            SessionConfig(
                prompt=(chat_prompt if args.chat else encode_prompt)(
                    drafter.model, view.prompt_text
                ),
                max_new_tokens=args.tokens,
                temperature=args.temperature,
                seed=args.seed + i,
                mode=args.mode,
                draft=drafter.spec,
            )
        )
    return configs


def make_state(args: argparse.Namespace, address: str = "", pid: int | None = None) -> DemoState:
    """The screen's initial contents from the command line (the pair resolved first)."""
    resolve_pair(args)
    settings = DemoSettings(
        tenants=args.tenants,
        mode=args.mode,
        depth=1 if args.mode == "sync" else args.depth,
        gamma=args.gamma,
        rtt_ms=args.rtt_ms,
        jitter_ms=args.jitter_ms,
        temperature=args.temperature,
        max_new_tokens=args.tokens,
        seconds=args.seconds,
        verifier=address,
        spawned=args.verifier is None,
        verifier_pid=pid,
        checkpoint=args.checkpoint,
        draft=args.draft,
        quantize=args.quantize,
    )
    views = [
        TenantView(index=i, prompt_text=p, max_new_tokens=args.tokens)
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

    loop = asyncio.get_running_loop()
    result = DemoResult(state=state)
    s = state.settings
    said = {"text": "", "t": float("-inf")}

    def phase(word: str, detail: str = "", *, tick: bool = False) -> None:
        with state.lock:
            state.phase, state.detail = word, detail
        text, now = detail or word, loop.time()
        if on_phase is not None and text != said["text"]:
            if not tick or now - said["t"] >= PROGRESS_EVERY_S:
                said.update(text=text, t=now)
                on_phase(text)

    step = {"text": ""}  # what the demo itself is doing while the verifier starts

    def starting(text: str | None = None, *, tick: bool = False) -> None:
        if text is not None:
            step["text"] = text
        words = step["text"]
        if s.spawned and not address_fut.done():
            counts = warmup_progress(verifier_log()) if verifier_log is not None else None
            if counts is None:
                words += "; the verifier is loading its target"
            elif counts[1]:
                words += f"; the verifier is compiling its batch shapes {counts[0]}/{counts[1]}"
        phase("starting", words + "…", tick=tick)

    async def tick_starting() -> None:
        while True:
            await asyncio.sleep(0.5)
            starting(tick=True)

    token = args.token or os.environ.get("JAXSPEC_TOKEN")
    if not s.spawned:  # the verifier first (a second), then the draft (tens of seconds)
        phase("starting", f"checking the verifier {args.verifier}…")
        async with GrpcEndpoint(args.verifier, token=token, timeout_s=CHECK_TIMEOUT_S) as ep:
            await check_verifier(ep, serving=False)  # warming up is fine: waited for below
    address_fut = asyncio.ensure_future(wait_address())
    ticker = asyncio.ensure_future(tick_starting())
    try:
        starting(f"loading the {s.quantize.upper()} draft {s.draft}")
        drafter = await loop.run_in_executor(
            None, load_drafter, args.draft, args.quantize, draft_spec_from_args(args)
        )
        configs = _configs(args, state, drafter)
        starting("compiling the draft model")
        await loop.run_in_executor(None, _compile_drafter, drafter, configs, s.depth)
        if not address_fut.done():
            starting("draft ready; waiting for the verifier")
        address = await address_fut
    finally:
        address_fut.cancel()
        ticker.cancel()
    with state.lock:
        s.verifier = address

    lazy = args.verifier is None and not args.warmup
    kw = dict(token=token) | (dict(timeout_s=LAZY_RESULT_TIMEOUT_S) if lazy else {})
    endpoints = [GrpcEndpoint(address, **kw) for _ in state.tenants]
    monitor = GrpcEndpoint(address, **kw)
    try:  # the figures this demo's own are counted from, once the verifier serves
        state.set_baseline(
            await check_verifier(
                monitor,
                retry_s=WAIT_SERVING_S,
                on_retry=lambda notice: phase("starting", f"{notice}…"),
            )
        )
    except BaseException:
        for ep in (*endpoints, monitor):
            with contextlib.suppress(Exception):
                await ep.aclose()
        raise
    one_way, jitter = args.rtt_ms / 2e3, args.jitter_ms / 2e3

    stopping = False  # set when the run ends: no tenant starts another sample

    async def tenant(i: int) -> None:
        view = state.tenants[i]
        cfg = configs[i]
        sample = 0
        try:
            while True:
                if sample:  # --seconds: a fresh sample with the next seed
                    cfg = dataclasses.replace(cfg, seed=cfg.seed + len(state.tenants))
                with state.lock:
                    view.start_sample(cfg.prompt)
                # A fresh simulated link per session: a DelayedEndpoint whose message was
                # cancelled mid-flight (blocks still in flight when a session ends) would
                # hold every later message of that direction behind it.
                ep = DelayedEndpoint(
                    endpoints[i], one_way_s=one_way, jitter_s=jitter, seed=cfg.seed
                )

                def on_event(kind: str, toks: tuple[int, ...]) -> None:
                    with state.lock:
                        first = view.tokens == 0
                        view.on_event(kind, toks)
                        first = first and view.tokens > 0
                    if first and on_phase is not None:
                        t = state.elapsed_s()
                        on_phase(f"edge {i + 1}: first tokens {t:.1f} s after start")

                # --gamma auto: each block's length from what this session measures.
                policy = (
                    AdaptiveGamma(cfg.draft.gamma, cfg.mode, s.depth)
                    if cfg.draft.adaptive
                    else None
                )
                await run_session(
                    ep, drafter, cfg, depth=s.depth, on_event=on_event, block_len=policy
                )
                sample += 1
                if args.seconds <= 0 or stopping:
                    break
            with state.lock:
                view.finish("stopped" if stopping else "done")
        except asyncio.CancelledError:
            with state.lock:
                view.finish("stopped" if view.status == "drafting" else view.status)
            raise
        except Exception as e:  # one tenant's failure is shown, the others go on
            msg = f"{getattr(e, 'code', type(e).__name__)}: {e}"
            result.errors.append(f"edge {i + 1}: {msg}")
            with state.lock:
                view.finish("error", msg)

    async def poll_stats() -> None:
        while True:
            try:
                state.set_stats(await monitor.stats())
            except Exception as e:
                state.set_stats(None, f"stats unavailable: {e}")
            state.sample_throughput()
            await asyncio.sleep(STATS_EVERY_S)

    phase("running")
    tasks = [asyncio.ensure_future(tenant(i)) for i in range(len(state.tenants))]
    poller = asyncio.ensure_future(poll_stats())
    try:
        timeout = args.seconds if args.seconds > 0 else None
        await asyncio.wait(tasks, timeout=timeout)
        phase("done" if all(t.done() for t in tasks) else "time is up")
    except asyncio.CancelledError:  # Ctrl-C, SIGTERM: stop the tenants, keep the screen
        result.interrupted = True
        asyncio.current_task().uncancel()
        phase("interrupted")
    finally:
        if on_end is not None:  # the screen as the run ends, drafts in flight included
            on_end()
        # The sessions close in run_session's `finally`. A cancellation can be lost (on
        # Python 3.11 `asyncio.wait_for` returns a result that arrives together with the
        # cancel), so cancel until every tenant has stopped.
        stopping = True
        pending = set(tasks)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            state.set_stats(await asyncio.wait_for(monitor.stats(), 2.0))
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(poller, return_exceptions=True)
        for ep in (*endpoints, monitor):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await ep.aclose()
    return result
