"""A Hypothesis state machine drives the scheduler like many unruly clients at once."""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import jax
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

import jaxspec
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.protocol import (
    DraftBlock,
    DraftSpec,
    NotFound,
    ResourceExhausted,
    SamplingSettings,
    SessionConfig,
)
from verify import Scheduler, SchedulerConfig

MAX_SESSIONS, NEW = 4, 12


@functools.cache
def target() -> jaxspec.Model:
    cfg = tiny_config()
    m = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
    return m.with_params(jax.tree.map(lambda a: a * 3, m.params))


@functools.cache
def scheduler() -> Scheduler:
    """One scheduler (and its compilations) for every example; each example must leave it
    empty, which the teardown checks."""
    config = SchedulerConfig(
        max_sessions=MAX_SESSIONS,
        max_len=64,
        max_gamma=4,
        row_buckets=(1, 2, 4),
        max_queue_per_session=4,
    )
    s = Scheduler(target(), config)
    s.warmup()
    return s


@functools.cache
def plain(prompt: tuple[int, ...]) -> list[int]:
    return jaxspec.generate(target(), list(prompt), NEW, temperature=0.0).tokens


class Client:
    """What an edge knows: the tokens it was told, its epoch, where its next draft goes."""

    def __init__(self, sid: str, tenant: str, cfg: SessionConfig):
        self.sid, self.tenant, self.cfg = sid, tenant, cfg
        self.told: list[int] = []
        self.epoch = 0
        self.next_start = len(cfg.prompt)
        self.in_flight = 0
        self.finished = False


class VerifierMachine(RuleBasedStateMachine):
    clients = Bundle("clients")

    def __init__(self):
        super().__init__()
        self.s = scheduler()
        self.by_ticket: dict[int, Client] = {}
        self.blocks: dict[int, DraftBlock] = {}
        self.open: dict[str, Client] = {}

    @rule(
        target=clients,
        prompt=st.lists(st.integers(0, 63), min_size=1, max_size=6).map(tuple),
        gamma=st.integers(1, 4),
        mode=st.sampled_from(["sync", "pipelined"]),
        encoding=st.sampled_from(["onehot", "full"]),
        tenant=st.sampled_from(["A", "B"]),
    )
    def open_session(self, prompt, gamma, mode, encoding, tenant):
        cfg = SessionConfig(
            prompt=prompt,
            max_new_tokens=NEW,
            mode=mode,
            sampling=SamplingSettings(temperature=0.0),
            draft=DraftSpec(gamma=gamma, encoding=encoding),
        )
        if len(self.open) == MAX_SESSIONS:
            try:
                self.s.open(cfg, tenant)
            except ResourceExhausted:
                return None
            raise AssertionError("a full pool accepted a session")
        c = Client(self.s.open(cfg, tenant).session_id, tenant, cfg)
        self.open[c.sid] = c
        return c

    def _block(self, c: Client, wrong_at: int | None, start_shift: int, epoch_lag: int):
        n = c.cfg.draft.gamma
        start = c.next_start + start_shift
        ref = plain(c.cfg.prompt) + [0] * 16
        toks = [ref[max(0, p - len(c.cfg.prompt))] for p in range(start, start + n)]
        if wrong_at is not None and wrong_at < n:
            toks[wrong_at] = (toks[wrong_at] + 1) % 64
        q = None
        if c.cfg.draft.encoding == "full":
            q = [[0.5 / 63] * 64 for _ in range(n)]
            for j, t in enumerate(toks):
                q[j][t] = 0.5
        return DraftBlock(
            session_id=c.sid,
            epoch=max(0, c.epoch - epoch_lag),
            start=start,
            tokens=tuple(toks),
            q=q,
        )

    @rule(
        c=clients,
        wrong_at=st.none() | st.integers(0, 3),
        start_shift=st.sampled_from([0, 0, 0, 1, -1]),
        epoch_lag=st.sampled_from([0, 0, 0, 1]),
    )
    def submit(self, c, wrong_at, start_shift, epoch_lag):
        if c is None or c.sid not in self.open or c.finished:
            return
        if c.cfg.mode == "sync" and c.in_flight:
            return
        block = self._block(c, wrong_at, start_shift, epoch_lag)
        if block.start < len(c.cfg.prompt):
            return
        try:
            ticket = self.s.submit(block, c.tenant)
        except ResourceExhausted:
            assert len(self.s.sessions[c.sid].queue) == self.s.config.max_queue_per_session
            return
        self.by_ticket[ticket] = c
        self.blocks[ticket] = block
        c.in_flight += 1
        if start_shift == 0 and epoch_lag == 0:
            c.next_start += len(block.tokens)  # optimistic: drafting goes on past it

    @rule()
    def tick(self):
        for ticket, r in self.s.tick():
            c = self.by_ticket.pop(ticket)
            block = self.blocks.pop(ticket)
            c.in_flight -= 1
            if r.stale:
                continue
            # Only a block of the current epoch that starts at the committed length counts.
            assert r.epoch == c.epoch == block.epoch
            assert block.start == len(c.cfg.prompt) + len(c.told)
            c.told += r.tokens
            c.finished = r.finished
            if r.new_epoch != c.epoch or r.next_token is not None:
                c.epoch = r.new_epoch
                c.next_start = len(c.cfg.prompt) + len(c.told)

    @rule(c=consumes(clients))
    def close(self, c):
        if c is None or c.sid not in self.open:
            return
        for ticket, r in self.s.close(c.sid, c.tenant):
            assert r.stale
            self.by_ticket.pop(ticket)
        del self.open[c.sid]
        try:
            self.s.submit(self._block(c, None, 0, 0), c.tenant)
        except NotFound:
            pass
        else:
            raise AssertionError("a closed session accepted a block")

    @invariant()
    def no_token_lost_or_duplicated(self):
        for c in self.open.values():
            s = self.s.sessions[c.sid]
            assert s.tokens[s.prompt_len :] == c.told
            assert c.told == plain(c.cfg.prompt)[: len(c.told)]
            assert s.epoch == c.epoch

    @invariant()
    def no_slot_leaks(self):
        used = [s.slot for s in self.s.sessions.values()]
        assert len(set(used)) == len(used) == len(self.open)
        assert sorted(used + self.s.free_slots) == list(range(MAX_SESSIONS))

    def teardown(self):
        for c in list(self.open.values()):
            self.s.close(c.sid, c.tenant)
        assert not self.s.sessions and not self.s.pending()


VerifierMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=40, deadline=None)
TestVerifierMachine = VerifierMachine.TestCase
