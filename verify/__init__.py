"""verify: the cloud side of jaxspec — KV slot pool, one padded jit-compiled multi-tenant
verify step (sharded over a ("data", "model") mesh), a continuous-batching scheduler and
`LocalVerifier`, the in-process `VerifierEndpoint`. It imports `jaxspec`, never `edge`.

The gRPC service over it (`python -m verify serve`): `verify.serve` starts and drains it,
`verify.servicer` answers the RPCs, `verify.tenants` authenticates and rate-limits callers,
`verify.metrics` counts for Prometheus; `verify.process` runs it as a subprocess."""

from verify.local import LocalVerifier
from verify.scheduler import Scheduler
from verify.scheduler_config import SchedulerConfig
from verify.sessions import Session
from verify.step import VerifyBatch, make_mesh, make_verify_step

__all__ = [
    "LocalVerifier",
    "Scheduler",
    "SchedulerConfig",
    "Session",
    "VerifyBatch",
    "make_mesh",
    "make_verify_step",
]
