"""Start-up and shutdown of the verifier service: `start()` puts a `LocalVerifier` behind a
gRPC server (message limits, TLS, health, optional reflection, the Prometheus endpoint, idle
eviction) and returns a `Server`, whose `drain()` ends it gracefully (docs/design.md §4).

`python -m verify serve` (verify/__main__.py) is the command line over this module; the RPCs
are `verify.servicer`'s, the tenants `verify.tenants`', the metrics `verify.metrics`'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection

from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from verify.local import LocalVerifier
from verify.metrics import MetricsServer, serve_metrics
from verify.servicer import VerifierService
from verify.tenants import Tenants

log = logging.getLogger("verify.serve")

SERVICE = "jaxspec.v1.Verifier"


def message_limit(vocab: int, max_gamma: int, prompt_len: int) -> int:
    """The largest valid message (a full-q block, or the longest prompt), with headroom."""
    block = max_gamma * (vocab * 4 + 16) + 256
    return 2 * max(block, prompt_len * 10 + 256)


@dataclasses.dataclass
class Server:
    """A running service: the grpc server, its servicer, health, the bound port and the
    metrics endpoint (None unless asked for)."""

    grpc_server: Any
    service: VerifierService
    health: Any
    port: int
    metrics: MetricsServer | None = None
    _tasks: list[asyncio.Task] = dataclasses.field(default_factory=list)

    async def drain(self, timeout_s: float = 30.0, min_s: float = 0.0) -> None:
        """Stop taking work, answer what was taken, end every stream with UNAVAILABLE.
        Stays up (NOT_SERVING) at least `min_s` so load balancers notice before the port
        closes, at most `timeout_s` for streams to finish."""
        await self.health.enter_graceful_shutdown()  # NOT_SERVING, and stays so
        self.service.draining.set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < min_s or (
            self.service.streams and time.monotonic() - t0 < timeout_s
        ):
            await asyncio.sleep(0.02)
        await self.stop(grace=1.0)
        s = self.service
        log.info(
            "drained: %d blocks answered while draining, %d taken but unanswered",
            s.answered_draining, s.unanswered_draining,
        )  # fmt: skip

    async def stop(self, grace: float | None = None) -> None:
        """Stop at once (after `grace` seconds for calls in flight): no drain."""
        for t in self._tasks:
            t.cancel()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
        await self.grpc_server.stop(grace)
        await self.service.verifier.aclose()


async def start(
    verifier: LocalVerifier,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tenants: Tenants | None = None,
    tls: tuple[bytes, bytes] | None = None,
    reflection: bool = False,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    evict_every_s: float = 5.0,
) -> Server:
    """Serve `verifier` on host:port (0 picks a free port) and return the `Server`.

    `tls` is (private key, certificate chain) in PEM; `metrics_port` (0: a free one) turns on
    the Prometheus endpoint on `metrics_host`, loopback unless said otherwise, whatever
    `host` is."""
    tenants = tenants or Tenants(None)
    cfg = verifier.scheduler.config
    limit = message_limit(verifier.scheduler.vocab, cfg.max_gamma, cfg.max_len)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    service = VerifierService(verifier, tenants)
    pb_grpc.add_VerifierServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if reflection:
        names = (pb.DESCRIPTOR.services_by_name["Verifier"].full_name, health.SERVICE_NAME)
        grpc_reflection.enable_server_reflection((*names, grpc_reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        key, cert = tls
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    out = Server(server, service, health_servicer, bound)
    if metrics_port is not None:
        try:
            out.metrics = serve_metrics(service.metrics.registry, metrics_host, metrics_port)
        except OSError:
            await out.stop()
            raise

    async def evict() -> None:
        while True:
            await asyncio.sleep(evict_every_s)
            await verifier.evict_idle()

    out._tasks.append(asyncio.ensure_future(evict()))
    return out
