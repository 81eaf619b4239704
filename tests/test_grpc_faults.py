"""Faults against real `python -m verify serve` processes: SIGKILL mid-generation and restart
(clients resume with zero lost or duplicated tokens), SIGTERM drain. The servers run the
newcomer's defaults (loopback, no tenants file) on a 2x2 mesh of forced CPU devices."""

from __future__ import annotations

import asyncio
import queue
import re
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import wire
from jaxspec_apps.bench.fleet import Fault
from tests import grpc_helpers as h

MESH = ["--mesh", "data=2,model=2", "--drain-min-s", "3"]
CONFIGS = [
    h.config(prompt=(1, 2, 3, 4), max_new_tokens=40, mode="pipelined", seed=1),
    h.config(prompt=(9, 8, 7), max_new_tokens=40, mode="sync", encoding="sparse", seed=2),
    h.config(prompt=(4, 4), max_new_tokens=40, encoding="onehot", temperature=0.0, seed=3),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    target, draft = h.write_models(root)
    env = h.server_env(root / "jax-cache", devices=8)
    server = h.spawn(target, *MESH, "--reflection", port=h.free_port(), env=env)
    try:
        yield dict(target=target, draft=draft, server=server)
    finally:
        server.stop()


def sessions(world, **kw):
    async def go():
        return await asyncio.gather(
            *(h.session(world["server"].address, world["draft"], c, **kw) for c in CONFIGS)
        )

    return h.run(go())


@pytest.fixture(scope="module")
def reference(world):
    return [t.tokens for t in sessions(world)]


def test_the_default_server_is_open_on_loopback_and_says_so(world):
    log = world["server"].log
    assert "no --tenants file: every caller is accepted" in log
    assert re.search(r"serving .* on 127\.0\.0\.1:\d+", log)


def test_sharded_server_equals_the_single_device_verifier(world, reference):
    """The 2x2 mesh gives the greedy session the tokens of an unsharded in-process run."""
    cfg = CONFIGS[2]

    assert h.run(h.local_session(world["target"], world["draft"], cfg)).tokens == reference[2]


def test_sigkill_mid_generation_then_restart_loses_and_repeats_nothing(world, reference):
    server = world["server"]
    # No drain, no goodbye; restarted on the same port from this thread, which outlives it.
    restart = Fault(12, lambda: (server.kill(), server.start()))
    traces = sessions(world, on_event=restart.session(0), resume_timeout_s=120)
    assert restart.happened and server.alive()
    assert [t.tokens for t in traces] == reference
    assert sum(t.resumes for t in traces) >= 1


def test_reflection_when_asked_for(world):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    ch = grpc.insecure_channel(world["server"].address)
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = list(stub.ServerReflectionInfo(iter([req]), timeout=10))
    names = {s.name for s in reply.list_services_response.service}
    assert {"jaxspec.v1.Verifier", "grpc.health.v1.Health"} <= names


def not_serving_within(ch: grpc.Channel, seconds: float) -> bool:
    health = health_pb2_grpc.HealthStub(ch)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        if status == health_pb2.HealthCheckResponse.NOT_SERVING:
            return True
        time.sleep(0.02)
    return False


def test_sigterm_drains_then_exits_zero(world):
    """SIGTERM mid-stream: health NOT_SERVING, new sessions UNAVAILABLE, every block taken
    is answered, the stream ends with UNAVAILABLE (the client resumes elsewhere), exit 0.

    A raw gamma-0 stream keeps WINDOW empty blocks in flight (each commits one token, so
    block k+WINDOW can be sent before block k is answered) and SIGTERM is sent just after a
    refill: WINDOW - 1 blocks the server has read and not answered, each a step of its own,
    whatever the machine's load (a drafting client sometimes had none in flight)."""
    server = world["server"]
    address = server.address
    window = 8  # the scheduler's max_queue_per_session
    cfg = h.config(gamma=0, max_new_tokens=100, mode="pipelined", temperature=0.0)
    requests: queue.Queue = queue.Queue()
    requests.put(pb.VerifyRequest(open=wire.config_to_proto(cfg)))
    start = len(cfg.prompt)

    def block(k: int) -> pb.VerifyRequest:
        return pb.VerifyRequest(block=pb.DraftBlock(start=start + k))

    ch = grpc.insecure_channel(address)
    replies = pb_grpc.VerifierStub(ch).Verify(iter(requests.get, None), timeout=120)
    assert next(replies).HasField("opened")
    for k in range(window):
        requests.put(block(k))
    got: list[int] = []
    with pytest.raises(grpc.RpcError) as ended:
        for reply in replies:
            assert reply.result.start == start + len(got) and len(reply.result.tokens) == 1
            got.append(reply.result.tokens[0])
            if len(got) == 3:
                requests.put(block(len(got) + window - 1))
                server.signal(signal.SIGTERM)
                assert not_serving_within(ch, 10)
                with pytest.raises(grpc.RpcError) as refused:
                    pb_grpc.VerifierStub(ch).OpenSession(wire.config_to_proto(cfg), timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            elif len(got) < 3:
                requests.put(block(len(got) + window - 1))
    requests.put(None)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
    assert server.proc.wait(60) == 0
    drained = re.search(r"drained: (\d+) blocks answered while draining, (\d+) taken", server.log)
    answered, unanswered = map(int, drained.groups())
    assert unanswered == 0 and answered >= 1, drained.group(0)
