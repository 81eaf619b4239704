"""verify: the cloud side of jaxspec — KV slot pool, one padded jit-compiled multi-tenant
verify step (sharded over a ("data", "model") mesh), a continuous-batching scheduler and
`LocalVerifier`, the in-process `VerifierEndpoint`. It imports `jaxspec`, never `edge`."""

from verify.local import LocalVerifier
from verify.scheduler import Scheduler, Session
from verify.step import VerifyBatch, make_mesh, make_verify_step

__all__ = ["LocalVerifier", "Scheduler", "Session", "VerifyBatch", "make_mesh", "make_verify_step"]
