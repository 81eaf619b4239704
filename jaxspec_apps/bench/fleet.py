"""Faults injected into sessions running over a fleet of verifiers, and what they cost: what
`tools/bench_fleet.py` measures and the fault tests (tests/test_fleet.py, test_deploy.py,
test_grpc_faults.py) assert on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

from edge.client import GrpcEndpoint

COMMITS = ("accept", "correct", "bonus")  # the session events that commit tokens


class Fault:
    """`act()` (kill a replica, SIGTERM it, ...) run once, as soon as the sessions fed to it
    have committed `after` tokens between them. Afterwards `moved[i]` is, for each session `i`
    that resumed, the seconds from the fault to its next committed token. Feed it every
    session's events: `on_event(i, kind, tokens)`, or `session(i)` as `run_session`'s
    `on_event`."""

    def __init__(self, after: int, act: Callable[[], None]):
        self.after = after
        self.act = act
        self.committed = 0
        self.at: float | None = None  # perf_counter time of the fault
        self.resumed: set[int] = set()
        self.moved: dict[int, float] = {}
        self._lock = threading.Lock()

    @property
    def happened(self) -> bool:
        return self.at is not None

    def on_event(self, i: int, kind: str, tokens: Sequence[int]) -> None:
        with self._lock:
            if kind == "resume":
                self.resumed.add(i)
            if kind in COMMITS and tokens:
                self.committed += len(tokens)
                if self.at is not None and i in self.resumed and i not in self.moved:
                    self.moved[i] = time.perf_counter() - self.at
            if self.at is None and self.committed >= self.after:
                self.act()
                self.at = time.perf_counter()

    def session(self, i: int) -> Callable[[str, Sequence[int]], None]:
        return lambda kind, tokens: self.on_event(i, kind, tokens)


async def connected(addresses: Sequence[str], **kw: object) -> GrpcEndpoint:
    """A fleet endpoint over `addresses` that has connected to every replica: gRPC's
    round_robin picks among the replicas connected so far, so sessions opened at once on a
    brand-new channel would all go to the first one."""
    ep = GrpcEndpoint(",".join(addresses), **kw)
    await ep.stats()
    await asyncio.sleep(1.0)
    return ep
