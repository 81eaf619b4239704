"""The verifier service's Prometheus metrics (`prometheus_client`), and their HTTP endpoint.

Each service has its own `CollectorRegistry` (not the process-global one: tests and tools
run several services in one process). What the registry exposes:

  counters   vllm:spec_decode_num_drafts_total{tenant}           blocks verified with drafts
             vllm:spec_decode_num_draft_tokens_total{tenant}     drafts verified
             vllm:spec_decode_num_accepted_tokens_total{tenant}  drafts accepted (committed)
             vllm:spec_decode_num_accepted_tokens_per_pos_total{tenant,position}
                                                       blocks whose draft at position was accepted
             jaxspec_committed_tokens_total{tenant}    tokens committed
             jaxspec_stale_blocks_total{tenant}        blocks answered stale
             jaxspec_sessions_opened_total{tenant}     sessions opened
             jaxspec_rejected_requests_total{method,status}  requests refused, by gRPC status
             jaxspec_verify_steps_total                batched verify steps (the scheduler's)
  histograms jaxspec_block_seconds{tenant}             a block's time in the service
             jaxspec_verify_step_seconds               one batched verify step
             jaxspec_batch_rows                        live rows per step (le = row buckets)
  gauges     jaxspec_sessions, jaxspec_queued_blocks, jaxspec_batch_occupancy (mean live /
             padded rows), jaxspec_serving (1 once warmed up, unless draining),
             jaxspec_kv_padding (share of the KV positions steps read that were padding),
             jaxspec_warmup_shapes_compiled / jaxspec_warmup_shapes (the warm-up's count)

The speculative-decoding counters carry vLLM's names (its v1 `vllm:spec_decode_*` metrics,
with a `tenant` label here), so a dashboard made for vLLM reads them; they sum the figures
every `VerifyResult` carries for its session (`jaxspec.protocol.AcceptanceFigures`). A
gamma-0 block (speculation off) moves none of them. The rest are jaxspec's own.

The gauges and the step counter are read from the service's `stats()` at scrape time, in the
HTTP server's thread. The endpoint is prometheus_client's own (`start_wsgi_server`) and
binds to loopback unless told otherwise: metrics name tenants, and carry no auth.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_wsgi_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jaxspec.figures import AcceptanceFigures

PREFIX = "jaxspec_"
VLLM = "vllm:spec_decode_"  # vLLM's names, where it has one


class _StatsCollector(Collector):
    """Gauges (and the step counter) read from `stats()` when scraped."""

    def __init__(self, stats: Callable[[], dict[str, Any]]):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        yield GaugeMetricFamily(PREFIX + "sessions", "live sessions", value=s["sessions"])
        yield GaugeMetricFamily(PREFIX + "queued_blocks", "blocks waiting", s["queued_blocks"])
        yield CounterMetricFamily(PREFIX + "verify_steps", "batched verify steps", s["steps"])
        yield GaugeMetricFamily(
            PREFIX + "batch_occupancy", "mean live/padded rows per step", s["mean_occupancy"]
        )
        yield GaugeMetricFamily(
            PREFIX + "serving", "1 once warmed up, unless draining", int(s["serving"])
        )
        yield GaugeMetricFamily(
            PREFIX + "kv_padding",
            "share of the KV positions verify steps read that were padding (filler rows, "
            "the KV bucket past a row's length)",
            s.get("kv_padding", 0.0),
        )
        yield GaugeMetricFamily(
            PREFIX + "warmup_shapes_compiled",
            "batch shapes the warm-up has compiled (of jaxspec_warmup_shapes)",
            s.get("warming_done", 0),
        )
        yield GaugeMetricFamily(
            PREFIX + "warmup_shapes",
            "batch shapes the warm-up compiles (0: none ahead)",
            s.get("warming_total", 0),
        )


class ServiceMetrics:
    """The counters and histograms a `VerifierService` updates, in one registry.

    `stats` gives the scheduler's figures (see `VerifierService.stats`); `row_buckets` are
    the scheduler's, so the rows histogram shows which compiled step shapes are used.
    """

    drafts: Counter  # the counters, made from the table in __init__
    drafted: Counter
    accepted: Counter
    accepted_per_pos: Counter
    committed: Counter
    stale: Counter
    sessions_opened: Counter
    rejected: Counter

    def __init__(self, stats: Callable[[], dict[str, Any]], row_buckets: Sequence[int]):
        self.registry = CollectorRegistry()
        r, tenant = self.registry, ["tenant"]
        counters = {  # attribute: (series, help, labels)
            "drafts": (VLLM + "num_drafts", "blocks verified with at least one draft", tenant),
            "drafted": (VLLM + "num_draft_tokens", "drafts verified", tenant),
            "accepted": (VLLM + "num_accepted_tokens", "drafts accepted (committed)", tenant),
            "accepted_per_pos": (
                VLLM + "num_accepted_tokens_per_pos",
                "blocks whose draft at this position (0 = first) was accepted",
                ["tenant", "position"],
            ),
            "committed": (PREFIX + "committed_tokens", "tokens committed", tenant),
            "stale": (PREFIX + "stale_blocks", "blocks answered stale", tenant),
            "sessions_opened": (PREFIX + "sessions_opened", "sessions opened", tenant),
            "rejected": (
                PREFIX + "rejected_requests",
                "requests refused, by gRPC status",
                ["method", "status"],
            ),
        }
        for attr, (series, text, labels) in counters.items():
            setattr(self, attr, Counter(series, text, labels, registry=r))
        self.block_seconds = Histogram(
            PREFIX + "block_seconds",
            "a block's time in the service, received to answered (rate limit, queue, step)",
            tenant,
            registry=r,
        )
        self.step_seconds = Histogram(
            PREFIX + "verify_step_seconds", "one batched verify step", registry=r
        )
        self.batch_rows = Histogram(
            PREFIX + "batch_rows",
            "live rows per verify step",
            buckets=[float(b) for b in sorted(row_buckets)],
            registry=r,
        )
        self.unanswered = Gauge(
            PREFIX + "unanswered_blocks",
            "blocks read from Verify streams and not yet answered (each stream holds at most "
            "verify.servicer.MAX_UNANSWERED)",
            registry=r,
        )
        r.register(_StatsCollector(stats))

    def observe_step(self, seconds: float, rows: int) -> None:
        """One verify step (a `LocalVerifier.step_observers` callback)."""
        self.step_seconds.observe(seconds)
        self.batch_rows.observe(rows)

    def count_stale(self, tenant: str) -> None:
        """One block of `tenant` answered stale (it counts nothing else)."""
        self.stale.labels(tenant).inc()

    def count_round(self, tenant: str, block: AcceptanceFigures) -> None:
        """One verified block of `tenant`, as its round's figures (`AcceptanceFigures.
        of_round`)."""
        if block.num_drafts:  # a gamma-0 block (no drafts) adds no series of vLLM's
            self.drafts.labels(tenant).inc(block.num_drafts)
            self.drafted.labels(tenant).inc(block.num_draft_tokens)
            self.accepted.labels(tenant).inc(block.num_accepted_tokens)
            for position, n in enumerate(block.accepted_per_position):
                if n:
                    self.accepted_per_pos.labels(tenant, str(position)).inc(n)
        self.committed.labels(tenant).inc(block.emitted)


@dataclasses.dataclass
class MetricsServer:
    """A running HTTP endpoint (any path answers the exposition) and its bound address."""

    httpd: WSGIServer
    thread: threading.Thread
    host: str
    port: int

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5.0)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve `registry` on http://host:port (0 picks a free port) from a daemon thread."""
    httpd, thread = start_wsgi_server(port, addr=host, registry=registry)
    bound_host, bound_port = httpd.server_address[:2]
    return MetricsServer(httpd, thread, str(bound_host), int(bound_port))
