"""A fleet of verifier replicas (`python -m verify serve` processes) behind one client channel
(`--verifier a,b,c`: gRPC's round_robin with grpc.health.v1 health checking). Sessions are
spread over the replicas; SIGKILL of one moves its sessions to the survivors, SIGTERM (drain)
too, and every session ends with exactly the tokens of an undisturbed run: nothing lost, nothing
repeated, no error reaching the caller."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys

import grpc
import pytest

from edge.client import channel_target
from edge.session import run_session
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec_apps.bench.fleet import Fault, connected
from tests import grpc_helpers as h
from verify.process import VerifierProcess

REPLICAS = 3
# 8 sessions of every mode and encoding, greedy and sampled.
CONFIGS = [
    h.config(prompt=(1 + i, 2, 3), max_new_tokens=32, seed=i, **kw)
    for i, kw in enumerate(
        [
            dict(mode="pipelined"),
            dict(mode="sync", encoding="sparse"),
            dict(mode="pipelined", encoding="onehot", temperature=0.0),
            dict(mode="sync", gamma=2),
            dict(mode="pipelined", temperature=0.7, top_k=8),
            dict(mode="pipelined", encoding="sparse", gamma=2),
            dict(mode="sync", encoding="onehot", temperature=0.0),
            dict(mode="pipelined", gamma=0),
        ]
    )
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    target, draft = h.write_models(root)
    env = h.server_env(root / "jax-cache")
    servers = [
        VerifierProcess(
            ["--checkpoint", str(target), *h.SERVER_FLAGS, "--drain-min-s", "1"], env=env
        ).start()
        for _ in range(REPLICAS)
    ]
    try:
        for s in servers:
            s.wait_ready(240)
        yield dict(target=target, draft=draft, servers=servers)
    finally:
        for s in servers:
            s.stop()


def addresses(fleet, alive_only: bool = False) -> str:
    return ",".join(s.address for s in fleet["servers"] if s.alive() or not alive_only)


def run_all(fleet, on_event=None, **kw):
    """Every session of CONFIGS at once over one fleet endpoint: their traces."""

    async def go():
        async with await connected(
            addresses(fleet).split(","), timeout_s=h.ENDPOINT_TIMEOUT_S
        ) as ep:

            async def one(i, cfg):
                g, enc = cfg.draft.gamma, cfg.draft.encoding
                d = h.drafter(str(fleet["draft"]), g, enc) if g else None  # gamma 0: none
                ev = None if on_event is None else (lambda k, t, i=i: on_event(i, k, t))
                return await run_session(ep, d, cfg, depth=2, on_event=ev, **kw)

            return await asyncio.gather(*(one(i, c) for i, c in enumerate(CONFIGS)))

    return h.run(go())


def committed_per_replica(fleet) -> list[int]:
    out = []
    for s in fleet["servers"]:
        stub = pb_grpc.VerifierStub(grpc.insecure_channel(s.address))
        out.append(stub.Stats(pb.StatsRequest(), timeout=10).tokens_committed)
    return out


@pytest.fixture(scope="module")
def reference(fleet):
    """The undisturbed run (also: the sessions were spread over every replica)."""
    traces = run_all(fleet)
    spread = committed_per_replica(fleet)
    assert all(n > 0 for n in spread), f"a replica got no session: {spread}"
    return [t.tokens for t in traces]


def test_a_fleet_target_is_grpc_round_robin_over_resolved_addresses():
    target, options = channel_target("localhost:1,127.0.0.1:2")
    assert target == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert '"round_robin"' in dict(options)["grpc.service_config"]
    assert '"healthCheckConfig"' in dict(options)["grpc.service_config"]
    assert dict(options)["grpc.ssl_target_name_override"] == "localhost"
    assert channel_target("dns:///verifier.ns.svc:50051")[0] == "dns:///verifier.ns.svc:50051"
    assert channel_target("localhost:5")[1] == []  # one verifier: no balancing policy
    for bad in ("nohost", "a:b", ",", "dns:///x:1,localhost:2"):
        with pytest.raises(ValueError):
            channel_target(bad)


def test_the_fleet_equals_a_single_in_process_verifier(fleet, reference):
    """Spread over replicas, a session is still exactly the one verifier's session."""
    got = h.run(h.local_session(fleet["target"], fleet["draft"], CONFIGS[0]))  # sampled
    assert got.tokens == reference[0]


def test_the_edge_command_takes_the_fleet(fleet, reference):
    """`python -m edge generate --verifier a,b,c` runs a whole session over the fleet."""
    cfg = CONFIGS[2]  # greedy, pipelined, onehot, gamma 4
    cmd = [
        sys.executable, "-m", "edge", "generate", "--verifier", addresses(fleet),
        "--checkpoint", str(fleet["target"]), "--draft", str(fleet["draft"]),
        "--quantize", "none", "--prompt", "fleet",
        "--max-new-tokens", str(cfg.max_new_tokens), "--temperature", "0", "--mode", "pipelined",
        "--encoding", "onehot", "--gamma", "4", "--seed", str(cfg.seed),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\[\d+ tokens, .* 0 resumes", proc.stderr), proc.stderr


def open_sessions(server) -> int:
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(server.address))
    return stub.Stats(pb.StatsRequest(), timeout=10).sessions


def test_sigkill_one_replica_moves_its_sessions_with_nothing_lost(fleet, reference):
    killed = []

    def kill_the_busiest():
        """SIGKILL (no drain, no goodbye) the replica serving the most sessions at that moment:
        round robin over a fresh channel may leave a replica without any."""
        victim = max(fleet["servers"], key=open_sessions)
        victim.kill()
        killed.append(victim)

    kill = Fault(60, kill_the_busiest)
    traces = run_all(fleet, on_event=kill.on_event, resume_timeout_s=60)
    assert kill.happened and not killed[0].alive()
    assert [t.tokens for t in traces] == reference  # 0 lost, 0 repeated, same draws
    assert sum(t.resumes for t in traces) >= 1 and kill.resumed
    print(f"sessions moved after SIGKILL: {len(kill.moved)}; seconds to the next commit: "
          f"{kill.moved}")  # fmt: skip


def test_sigterm_drains_one_replica_and_its_sessions_move_without_an_error(fleet, reference):
    survivors = [s for s in fleet["servers"] if s.alive()]
    assert len(survivors) >= 2
    victim = survivors[0]
    drain = Fault(60, lambda: victim.signal(signal.SIGTERM))
    traces = run_all(fleet, on_event=drain.on_event, resume_timeout_s=60)
    assert drain.happened
    assert [t.tokens for t in traces] == reference
    assert sum(t.resumes for t in traces) >= 1  # the drained replica's sessions moved
    assert victim.proc.wait(60) == 0  # drained and exited cleanly
    assert "drained:" in victim.log
