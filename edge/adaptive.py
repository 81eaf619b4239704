"""Adaptive gamma: the edge picks each block's length from what it measures.

Before drafting a block the session asks `AdaptiveGamma.next_gamma()`; the answer is the
block length in 0..longest with the least expected time per token under the papers' model
(`jaxspec.decoding.analytic`, the same formulas the benchmarks evaluate and `proofs/latency.py`
proves), fed with running measurements:

    alpha[i]   acceptance of draft i of a block given drafts 0..i-1 were accepted, counted per
               position from the verifier's answers (shrunk towards the pooled rate, so a
               position seldom tested is not trusted on a few samples)
    t_d        the edge's drafting time, as a fixed cost per block plus a cost per token
               fitted to the mean time of each block length drafted (the first block of
               each length is not counted: it includes that length's compilation)
    latency    time from sending a block to its answer: the round trip plus the verifier's
               queueing and step, i.e. the model's rtt + t_v
    t_v        the verifier's step time, which it reports with each answer (`step_s`)

All three are exponential moving averages, so the choice follows a link or a verifier that
gets slower or faster, and acceptance that changes with the text.

Stopping: in sync mode the answer may be 0, no drafting (an empty block: the verifier
samples the one token itself, as a gamma-0 session's), when one token per answer latency
beats the best block. Its measurements then go stale, so after `probe_every` empty blocks
in a row one block of the best length is drafted again (a probe) to refresh them. In
pipelined mode the answer is never 0: an empty block's token is plain decoding's draw
U(TARGET, t), a different function of the draws than a verified draft's, so stopping there
would make the output depend on timing (sync output already depends on the block ends
through the bonus draws; it stays exactly the target's law, as every draw is keyed by a
position the choice cannot see).

Starting: until both timings are measured, the block is the longest the acceptance
measurements support: the longest n whose last draft is reached with probability >= 1/2
under the current per-position estimates (longest before any answer, so the first block
measures every position).

Why the output does not change: every draw is keyed by its absolute position (docs/design.md
§2) and pipelined mode has no bonus token, so the token committed at each position is a
function of the committed prefix and the seed alone, whatever the block boundaries are: the
tokens of a pipelined session with adaptive gamma equal those of any fixed gamma (tested). In
sync mode the bonus token after a fully accepted block is drawn from the target at the block's
end, so block boundaries move which positions get a bonus draw: the output is still exactly
distributed as the target's, but not token-for-token equal to a fixed gamma's.
"""

from __future__ import annotations

from jaxspec.decoding import analytic


class AdaptiveGamma:
    """Running measurements of one session and the block length they call for.

    Args:
      longest: the longest block (the session's `DraftSpec.gamma`).
      mode: "sync" or "pipelined" (the session's mode; it selects the model's formula).
      depth: blocks in flight (pipelined).
      prior_alpha, prior_weight: the acceptance assumed before any answer, and how many
        observations it counts as.
      decay: weight of the newest timing sample in the moving averages.
      start_gamma: a fixed length until the timings are measured (None: the longest block
        the acceptance measured so far supports, module doc).
      probe_every: in sync mode, after this many empty blocks (0: no drafting) in a row,
        draft one block of the model's best length to refresh the measurements.
    """

    def __init__(
        self,
        longest: int,
        mode: str,
        depth: int = 1,
        *,
        prior_alpha: float = 0.6,
        prior_weight: float = 4.0,
        decay: float = 0.2,
        start_gamma: int | None = None,
        probe_every: int = 8,
    ) -> None:
        if longest < 1:
            raise ValueError(f"longest must be >= 1, got {longest}")
        if mode not in ("sync", "pipelined"):
            raise ValueError(f"mode must be 'sync' or 'pipelined', got {mode!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        self.longest = longest
        self.mode = mode
        self.depth = 1 if mode == "sync" else max(1, depth)
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.decay = decay
        self.tested = [0] * longest  # per position: answers that reached it
        self.accepted = [0] * longest  # per position: answers that accepted it
        self.t_draft: float | None = None  # seconds per draft token
        self.latency: float | None = None  # seconds from send to answer
        self.t_verify: float | None = None  # seconds of the verifier's step (it reports them)
        self._seen_lengths: set[int] = set()
        self.block_time: dict[int, float] = {}  # block length -> moving mean of its time
        self.start_gamma = start_gamma
        self.probe_every = probe_every
        self.allow_zero = mode == "sync"  # module doc: never 0 in pipelined mode
        self._empty_run = 0  # empty blocks chosen in a row
        self.chosen: list[int] = []  # every block length chosen, in order

    # --- measurements ---------------------------------------------------------------------

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.decay) * old + self.decay * new

    def observe_draft(self, gamma: int, seconds: float) -> None:
        """One block of `gamma` drafts took `seconds` on the edge (to drafts on the wire)."""
        if gamma not in self._seen_lengths:  # its first call compiled that length
            self._seen_lengths.add(gamma)
            return
        self.block_time[gamma] = self._ema(self.block_time.get(gamma), seconds)
        self.t_draft = self._ema(self.t_draft, seconds / gamma)

    def draft_time(self, gamma: int) -> float:
        """Expected edge time per draft token in a block of `gamma`: a line `fixed + per_token
        * gamma` fitted (least squares, both terms >= 0) to the mean block time of each length
        drafted so far. A block has a fixed cost (dispatch, moving q to the wire) that a
        per-token average taken at one length would spread wrongly over other lengths."""
        pts = sorted(self.block_time.items())
        if len(pts) < 2:
            g0, t0 = pts[0] if pts else (1, self.t_draft or 0.0)
            return t0 / g0
        n = len(pts)
        mg = sum(g for g, _ in pts) / n
        mt = sum(t for _, t in pts) / n
        var = sum((g - mg) ** 2 for g, _ in pts)
        slope = max(0.0, sum((g - mg) * (t - mt) for g, t in pts) / var)
        fixed = max(0.0, mt - slope * mg)
        return fixed / gamma + slope

    def observe_result(
        self, drafted: int, accepted: int, latency_s: float | None, step_s: float = 0.0
    ) -> None:
        """A block of `drafted` drafts came back with `accepted` of them accepted, `latency_s`
        after it was sent (None: not timed, e.g. a block answered stale); `step_s` is the
        verifier's step that answered it, as the verifier reports it (0: unknown)."""
        for i in range(min(drafted, accepted + 1)):  # drafts the rule looked at
            self.tested[i] += 1
            self.accepted[i] += i < accepted
        if latency_s is not None:
            self.latency = self._ema(self.latency, latency_s)
        if step_s > 0:
            self.t_verify = self._ema(self.t_verify, step_s)

    # --- the choice -----------------------------------------------------------------------

    def alphas(self) -> list[float]:
        """Per-position acceptance estimates, each shrunk towards the pooled rate."""
        n, a = sum(self.tested), sum(self.accepted)
        w = self.prior_weight
        pooled = (a + w * self.prior_alpha) / (n + w)
        pairs = zip(self.accepted, self.tested, strict=True)
        return [(acc + w * pooled) / (n_i + w) for acc, n_i in pairs]

    def __call__(self) -> int:
        """`run_session(..., block_len=controller)` calls it before each block."""
        return self.next_gamma()

    def supported_gamma(self) -> int:
        """The longest block the acceptance measured so far supports: the longest n whose
        last draft is reached (drafts 0..n-2 all accepted) with probability >= 1/2."""
        if not sum(self.tested):
            return self.longest
        reach, n = 1.0, 1
        for i, a in enumerate(self.alphas()[: self.longest - 1]):
            reach *= a
            if reach < 0.5:
                break
            n = i + 2
        return n

    def plain_token_time(self) -> float:
        """Expected seconds per token with no drafting (sync: one token per answer)."""
        return self.latency if self.latency is not None else float("inf")

    def next_gamma(self) -> int:
        """The length of the next block: until both timings are measured, `start_gamma` or
        the longest block the acceptance supports; then the model's best, or 0 (sync) when
        no drafting is faster, with a probe every `probe_every` empty blocks."""
        if self.t_draft is None or self.latency is None:
            g = self.start_gamma or self.supported_gamma()
        else:
            # The answer latency is the round trip plus the verifier's queueing and step; the
            # step alone (reported with each answer) also bounds the pipeline's spacing.
            t_v = min(self.t_verify or 0.0, self.latency)
            g = analytic.best_gamma(
                self.mode,
                self.alphas(),
                self.draft_time,
                self.latency - t_v,
                t_v,
                depth=self.depth,
                longest=self.longest,
            )
            if self.allow_zero and self.plain_token_time() < self.token_time(g):
                if self._empty_run < self.probe_every:
                    g = 0
                self._empty_run = 0 if g else self._empty_run + 1
            else:
                self._empty_run = 0
        self.chosen.append(g)
        return g

    def token_time(self, g: int) -> float:
        """The model's expected seconds per token for blocks of `g` drafts (timings known)."""
        t_v = min(self.t_verify or 0.0, self.latency)
        td = self.draft_time(g)
        if self.mode == "sync":
            return analytic.sync_token_time(g, self.alphas(), td, self.latency - t_v, t_v)
        return analytic.pipelined_token_time(
            g, self.alphas(), td, self.latency - t_v, t_v, self.depth
        )
