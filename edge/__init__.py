"""edge: the device side of jaxspec — the W4A16 drafter (own KV cache, rollback by length)
and the transport-agnostic session state machine (`EdgeSession`, run by `run_session`: sync,
or pipelined with blocks in flight, resuming after a verifier restart), `GrpcEndpoint` (the
gRPC client) and `DelayedEndpoint` (edge/delayed.py), a simulated WAN; `python -m edge
serve` puts an OpenAI-compatible HTTP endpoint in front of sessions (edge/openai_server.py,
the request and answer shapes in edge/openai_api.py). It imports `jaxspec`, never `verify`."""

from edge.client import GrpcEndpoint
from edge.delayed import DelayedEndpoint
from edge.drafter import Drafter, DrafterState
from edge.session import EdgeSession, SessionTrace, run_session

__all__ = [
    "DelayedEndpoint",
    "Drafter",
    "DrafterState",
    "EdgeSession",
    "GrpcEndpoint",
    "SessionTrace",
    "run_session",
]
