"""Faults against real `python -m verify serve` processes: SIGKILL mid-generation and restart
(clients resume with zero lost or duplicated tokens), SIGTERM drain. The servers run the
newcomer's defaults (loopback, no tenants file) on a 2x2 mesh of forced CPU devices."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jaxspec import wire
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import Unavailable
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
    committed = [0]
    restarted = threading.Event()

    def on_event(kind, tokens):
        if kind in ("accept", "correct", "bonus"):
            committed[0] += len(tokens)
        if committed[0] >= 12 and server.alive() and not restarted.is_set():
            server.kill()  # no drain, no goodbye
            restarted.set()
            server.start()  # same port; from this thread, which outlives the server

    traces = sessions(world, on_event=on_event, resume_timeout_s=120)
    assert restarted.is_set() and server.alive()
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


def test_sigterm_drains_then_exits_zero(world):
    """SIGTERM mid-stream: health NOT_SERVING, new sessions UNAVAILABLE, every block taken
    is answered, the streaming client gets UNAVAILABLE (to resume elsewhere), exit 0."""
    server = world["server"]
    address = server.address
    # One draft per block, four in flight: the client drafts faster than the server verifies,
    # so blocks are always taken and not yet answered when SIGTERM lands (answered >= 1
    # below; with gamma 4 a client on a busy machine sometimes had none in flight).
    cfg = h.config(max_new_tokens=100, mode="pipelined", seed=9, gamma=1)
    outcome: list = []
    started = threading.Event()

    def on_event(kind, tokens):
        if kind == "accept":
            started.set()

    def client():
        try:
            h.run(h.session(address, world["draft"], cfg, depth=4, on_event=on_event))
            outcome.append("finished")
        except Unavailable as e:
            outcome.append(e)

    t = threading.Thread(target=client)
    t.start()
    assert started.wait(60)
    server.signal(signal.SIGTERM)
    ch = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(ch)
    deadline = time.monotonic() + 10
    while True:
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        if status == health_pb2.HealthCheckResponse.NOT_SERVING or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.VerifierStub(ch).OpenSession(wire.config_to_proto(cfg), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    t.join(60)
    assert server.proc.wait(60) == 0
    assert isinstance(outcome[0], Unavailable), outcome
    drained = re.search(r"drained: (\d+) blocks answered while draining, (\d+) taken", server.log)
    answered, unanswered = map(int, drained.groups())
    assert unanswered == 0 and answered >= 1, drained.group(0)
