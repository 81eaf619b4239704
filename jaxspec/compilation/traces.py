"""Which JAX traces a block of code ran: whether a jitted call met a shape for the first
time (and so compiled, or loaded from the persistent cache), heard through the public
`jax.monitoring` events rather than a jitted function's private cache size."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax.monitoring

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"  # JAX traces a shape it has not seen
_local = threading.local()


def _on_event(name: str, _seconds: float, **_: Any) -> None:
    seen = getattr(_local, "seen", None)
    if name == TRACE_EVENT and seen is not None:
        seen.append(name)


jax.monitoring.register_event_duration_secs_listener(_on_event)


@contextlib.contextmanager
def traces() -> Iterator[list[str]]:
    """The traces this thread runs inside the block, as a list that fills as they happen:
    empty when every jitted call found its shape in JAX's in-memory cache. Other threads'
    traces are not counted; nested blocks count toward the outer one too."""
    outer = getattr(_local, "seen", None)
    _local.seen = seen = []
    try:
        yield seen
    finally:
        _local.seen = outer
        if outer is not None:
            outer.extend(seen)
