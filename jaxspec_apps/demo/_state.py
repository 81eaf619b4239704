"""What the demo screen shows, as plain data fed by session events and verifier stats.

Kept apart from drawing (`_render`) and from running (`_run`) so it can be tested without
JAX, gRPC or a terminal. Every mutation holds `DemoState.lock`: rich's refresh thread reads
while the event loop writes.

A tenant's text is a list of pieces in the order the edge learns about them:

    prompt | accepted drafts | rejected drafts | correction/bonus | accepted | ...  in flight
    (bold)    (green)          (red, struck)     (yellow / cyan)                 (dim)

Rejected drafts are shown where they were proposed but are not part of the output; the
drafts in flight (sent, not yet answered) trail the committed text until their verdict.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from jaxspec.figures import AcceptanceFigures

# Piece kinds, in the vocabulary of vLLM's rejection sampler (accepted / recovered / bonus).
PROMPT, ACCEPT, CORRECT, BONUS, REJECT = "prompt", "accept", "correct", "bonus", "reject"
SEPARATOR = "separator"  # between samples in --seconds mode
_CONTEXT = 8  # tokens of left context when decoding a piece (merges, leading spaces)


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux: its start time in /proc/self/stat against
    the boot clock), None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0.0 <= age < 86400.0 else None


# When the command started, on `time.perf_counter`'s clock: the process's start (what the
# user waited from pressing Enter: interpreter, imports, fetching, building, compiling
# included), or, where that cannot be read, when this module was imported. The demo's
# elapsed time and TTFT count from here.
COMMAND_START_T = time.perf_counter() - (_process_age_s() or 0.0)


def decode_delta(
    decode: Callable[[list[int]], str], context: Sequence[int], new: Sequence[int]
) -> str:
    """The text `new` adds after `context`: decode(context + new) minus decode(context).

    Byte-level BPE and sentencepiece tokenizers decode a token differently alone than after
    its left neighbours (leading spaces, merged bytes), so each piece is decoded in context.
    """
    if not new:
        return ""
    ctx = list(context[-_CONTEXT:])
    whole, head = decode(ctx + list(new)), decode(ctx)
    return whole[len(head) :] if whole.startswith(head) else decode(list(new))


@dataclasses.dataclass
class TenantView:
    """One edge tenant: its text pieces and live counters, fed by `run_session` events."""

    index: int
    prompt_text: str
    decode: Callable[[list[int]], str] = lambda ids: " ".join(map(str, ids))
    max_new_tokens: int = 0
    status: str = "waiting"  # waiting | drafting | done | stopped | error
    error: str = ""
    pieces: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    inflight: list[tuple[tuple[int, ...], str]] = dataclasses.field(default_factory=list)
    ids: list[int] = dataclasses.field(default_factory=list)  # prompt + committed
    prompt_len: int = 0
    sample: int = 0  # samples started (a new one per seed in --seconds mode)
    _sample_start: int = 0  # index in `pieces` where the current sample begins
    _round_t: float | None = None  # when the current round's verdict arrived
    # Counters over every sample.
    tokens: int = 0
    figures: AcceptanceFigures = dataclasses.field(default_factory=AcceptanceFigures)
    rejections: int = 0
    stale: int = 0
    resumes: int = 0
    # Timing: steady-state rate from each sample's first commit (compilation excluded).
    sample_open_t: float | None = None
    first_commit_t: float | None = None
    last_commit_t: float | None = None
    ttft_s: list[float] = dataclasses.field(default_factory=list)  # each from its session's open
    command_t: float | None = None  # the command's start (`DemoState` sets it)
    first_token_s: float | None = None  # the first token, seconds from the command's start
    steady_tokens: int = 0  # tokens after each sample's first commit
    steady_s: float = 0.0  # time after each sample's first commit, closed samples
    recent: deque = dataclasses.field(default_factory=lambda: deque(maxlen=512))

    # ---- lifecycle ------------------------------------------------------------------------

    def start_sample(self, prompt_ids: Sequence[int], now: float | None = None) -> None:
        """A new session begins at the prompt; the previous sample's text stays above it
        (older ones are dropped) and the counters keep going."""
        self._close_sample()
        self.sample += 1
        self.ids = list(prompt_ids)
        self.prompt_len = len(self.ids)
        previous = self.pieces[self._sample_start :]
        if previous:
            previous.append((SEPARATOR, f"\n── sample {self.sample} ──\n"))
        self._sample_start = len(previous)
        self.pieces = [*previous, (PROMPT, self.prompt_text)]
        self.inflight = []
        self.status = "drafting"
        self.sample_open_t = time.perf_counter() if now is None else now
        self.first_commit_t = self.last_commit_t = self._round_t = None

    def finish(self, status: str = "done", error: str = "") -> None:
        self._close_sample()
        self.inflight = []
        self.status = status
        self.error = error

    def _close_sample(self) -> None:
        if self.first_commit_t is not None and self.last_commit_t is not None:
            self.steady_s += self.last_commit_t - self.first_commit_t
        self.first_commit_t = None

    # ---- events -----------------------------------------------------------------------------

    def on_event(self, kind: str, tokens: Sequence[int], now: float | None = None) -> None:
        """Apply one `edge.session.run_session` event (draft, accept, reject, correct, bonus,
        stale, resume)."""
        now = time.perf_counter() if now is None else now
        toks = [int(t) for t in tokens]
        if kind == "draft":
            ctx = self.ids + [t for ids, _ in self.inflight for t in ids]
            self.inflight.append((tuple(toks), decode_delta(self.decode, ctx, toks)))
        elif kind == "accept":  # the head block's verdict: its first len(toks) drafts hold
            block = self.inflight.pop(0)[0] if self.inflight else tuple(toks)
            self.figures += AcceptanceFigures.of_round(len(block), len(toks), len(toks))
            self._round_t = now
            self._commit(ACCEPT, toks, now)
        elif kind == "reject":
            self.rejections += 1
            self.pieces.append((REJECT, decode_delta(self.decode, self.ids, toks)))
        elif kind in (CORRECT, BONUS):  # the same round as the accept before it
            self.figures += AcceptanceFigures(emitted=len(toks))
            self._commit(kind, toks, self._round_t if self._round_t is not None else now)
        elif kind == "stale":
            if self.inflight:
                self.inflight.pop(0)
            self.stale += 1
        elif kind == "resume":
            self.inflight = []
            self.resumes += 1

    def _commit(self, kind: str, toks: list[int], now: float) -> None:
        if not toks:
            return
        text = decode_delta(self.decode, self.ids, toks)
        self.ids += toks
        if self.pieces and self.pieces[-1][0] == kind:  # merge neighbours: fewer spans
            self.pieces[-1] = (kind, self.pieces[-1][1] + text)
        else:
            self.pieces.append((kind, text))
        self.tokens += len(toks)
        self.recent.append((now, len(toks)))
        if self.first_commit_t is None:
            self.first_commit_t = now
            if self.sample_open_t is not None:
                self.ttft_s.append(now - self.sample_open_t)
            if self.first_token_s is None and self.command_t is not None:
                self.first_token_s = now - self.command_t
        elif now > self.first_commit_t:  # the first round's tokens carry its latency
            self.steady_tokens += len(toks)
        self.last_commit_t = now

    # ---- figures ----------------------------------------------------------------------------

    @property
    def new_tokens(self) -> int:
        """Tokens committed in the current sample."""
        return len(self.ids) - self.prompt_len

    def _steady(self) -> tuple[int, float]:
        s = self.steady_s
        if self.first_commit_t is not None and self.last_commit_t is not None:
            s += self.last_commit_t - self.first_commit_t
        return self.steady_tokens, s

    @property
    def tokens_per_s(self) -> float:
        """Steady-state rate: tokens after each sample's first commit over the time since it
        (the first round carries compilation and the prompt's prefill)."""
        n, s = self._steady()
        return n / s if s > 0 else 0.0

    @property
    def inter_token_latency_s(self) -> float:
        """Mean time per token in the steady state (tokens of one round arrive together)."""
        n, s = self._steady()
        return s / n if n else 0.0

    def recent_tokens_per_s(self, now: float, window_s: float = 3.0) -> float:
        """Rate over the last `window_s` seconds (what the panel shows while running)."""
        n = sum(k for t, k in self.recent if t > now - window_s)
        return n / window_s


@dataclasses.dataclass
class DemoSettings:
    """The run's parameters, shown in the header."""

    tenants: int = 3
    mode: str = "pipelined"
    depth: int = 2
    gamma: int | str = 4  # or "auto"
    rtt_ms: float = 50.0
    jitter_ms: float = 5.0
    temperature: float = 0.7
    max_new_tokens: int = 160
    seconds: float = 0.0
    verifier: str = ""  # address, filled in once known
    spawned: bool = True
    verifier_pid: int | None = None
    checkpoint: str = "default"
    draft: str = "default-draft"
    quantize: str = "w4a16"


@dataclasses.dataclass
class DemoState:
    """Everything on screen; `lock` guards it against the refresh thread."""

    settings: DemoSettings
    tenants: list[TenantView]
    phase: str = "starting"  # one word for the header: starting, running, done, ...
    detail: str = ""  # what it is waiting for, shown until the verifier's figures arrive
    started_t: float = COMMAND_START_T  # elapsed time and TTFT count from here
    serving_s: float | None = None  # when the verifier served, seconds from `started_t`
    stats: dict = dataclasses.field(default_factory=dict)  # the verifier's, verifier-wide
    baseline: dict = dataclasses.field(default_factory=dict)  # its Stats as the tenants began
    stats_error: str = ""
    throughput: deque = dataclasses.field(default_factory=lambda: deque(maxlen=240))
    rows_per_step: float | None = None  # our verified blocks per verifier step, lately
    stalled_s: float = 0.0  # how long blocks have waited with no step taken (compiling)
    _steps_moved_t: float | None = None
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    _history: deque = dataclasses.field(default_factory=deque)  # (t, tokens, rounds, steps)

    def __post_init__(self) -> None:
        for view in self.tenants:
            view.command_t = self.started_t

    def total_tokens(self) -> int:
        """Tokens this demo's tenants committed (its own figure, whoever else shares the
        verifier)."""
        return sum(t.tokens for t in self.tenants)

    def total_rounds(self) -> int:
        """Blocks this demo's tenants had verified."""
        return sum(t.figures.rounds for t in self.tenants)

    def set_baseline(self, stats: dict) -> None:
        """The verifier's figures just before the tenants start: its lifetime counters (steps,
        tokens committed) are shown as differences from these."""
        with self.lock:
            self.baseline = dict(stats)
            self.set_stats(stats)
            if self.serving_s is None:  # the baseline is taken once the verifier serves
                self.serving_s = self.elapsed_s()

    def since_start(self, key: str) -> int:
        """A verifier-wide counter (`steps`, `tokens_committed`) since the tenants started
        (other clients of a shared verifier count too)."""
        with self.lock:
            return int(self.stats.get(key, 0)) - int(self.baseline.get(key, 0))

    def sample_throughput(self, now: float | None = None, window_s: float = 2.0) -> None:
        """Append the all-tenant tokens/s since the previous sample (the sparkline) and
        update the rows per verifier step over the last `window_s`: blocks our tenants had
        verified / steps the verifier took (how much they share batches; on a shared remote
        verifier other clients' steps count too)."""
        now = time.perf_counter() if now is None else now
        with self.lock:
            point = (now, self.total_tokens(), sum(t.figures.rounds for t in self.tenants))
            point += (int(self.stats.get("steps", 0)),)
            if self._history:
                t0, n0, _, _ = self._history[-1]
                if now > t0:
                    self.throughput.append((point[1] - n0) / (now - t0))
            self._history.append(point)
            while len(self._history) > 2 and self._history[1][0] <= now - window_s:
                self._history.popleft()
            _, _, r0, s0 = self._history[0]
            if point[3] > s0:
                self.rows_per_step = (point[2] - r0) / (point[3] - s0)

    def set_stats(self, stats: dict | None, error: str = "", now: float | None = None) -> None:
        """Record the verifier's figures; notice when blocks wait but no step runs (the
        verifier compiles a batch shape it meets for the first time)."""
        now = time.perf_counter() if now is None else now
        with self.lock:
            self.stats_error = error
            if stats is None:
                return
            moved = stats.get("steps") != self.stats.get("steps")
            waiting = stats.get("queued_blocks", 0) > 0
            if moved or not waiting or self._steps_moved_t is None:
                self._steps_moved_t = now
            self.stalled_s = now - self._steps_moved_t
            self.stats = dict(stats)

    def elapsed_s(self, now: float | None = None) -> float:
        """Seconds since the command started (`started_t`), wall-clock."""
        now = time.perf_counter() if now is None else now
        return now - self.started_t
