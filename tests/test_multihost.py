"""The multi-host verifier (verify/multihost.py, docs/multihost.md) on this machine: two
`python -m verify serve` processes of 4 CPU devices each, joined by `jax.distributed`, one
mesh data=4,model=2 over the 8 devices (the "data" axis crosses the two processes).

Its tokens must equal a 1-process verifier's for the same sessions (greedy and sampled,
speculative with a draft, gamma 0); a clean drain ends both processes with 0; a follower
killed with SIGKILL makes the leader say NOT_SERVING and exit 3 within the stated time."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import pathlib
import threading
import time
import zlib

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import jaxspec
from edge.client import GrpcEndpoint
from edge.session import run_session
from tests import grpc_helpers as h
from verify import LocalVerifier, SchedulerConfig, multihost
from verify.process import VerifierProcess
from verify.step import make_mesh

MESH = "data=4,model=2"
HEARTBEAT_S = 4  # the kill test's --heartbeat-timeout-s
# The leader's exit after a follower's death: heartbeat_timeout_s + 2 s is the stated bound
# (verify/multihost.py; measured ~1.5 s past the heartbeat on an idle machine), plus the
# leader's NOT_SERVING hold (--drain-min-s 1) and slack for a loaded 2-core CI machine.
EXIT_BOUND_S = HEARTBEAT_S + 2 + 1 + 3

SESSIONS = [  # greedy and sampled, every q encoding, speculation off; one drafter length
    h.config(prompt=(1, 2, 3, 4), temperature=0.0, mode="sync", gamma=3, encoding="onehot"),
    h.config(prompt=(9, 8, 7), temperature=1.0, gamma=3, encoding="sparse", seed=5),
    h.config(prompt=(5, 6), temperature=0.8, gamma=3, encoding="full", seed=7, mode="sync"),
    h.config(prompt=(3, 3, 3), temperature=1.0, top_k=20, gamma=0, seed=2),
]
SESSIONS = [dataclasses.replace(c, max_new_tokens=16) for c in SESSIONS]


def spawn_pair(root: pathlib.Path, target: pathlib.Path, *extra: str):
    """A follower (process 1) and a leader (process 0, serving on a free port), ready."""
    coordinator = f"127.0.0.1:{h.free_port()}"
    flags = [
        "--checkpoint", str(target), *h.SERVER_FLAGS, "--mesh", MESH,
        "--coordinator", coordinator, "--num-processes", "2", *extra,
    ]  # fmt: skip
    env = h.server_env(root / "jax-cache", devices=4)
    follower = VerifierProcess([*flags, "--process-id", "1"], env=env).start()
    leader = VerifierProcess([*flags, "--process-id", "0"], env=env).start()
    try:
        leader.wait_ready(180)
    except Exception:
        follower.kill()
        leader.kill()
        raise RuntimeError(
            f"leader:\n{leader.log_tail()}\nfollower:\n{follower.log_tail()}"
        ) from None
    return leader, follower


def session_over(address: str, draft: pathlib.Path, cfg):
    d = h.drafter(str(draft), cfg.draft.gamma, cfg.draft.encoding) if cfg.draft.gamma else None

    async def go():
        # The first blocks wait for both processes to compile the step (cold cache, 2 cores).
        async with GrpcEndpoint(address, timeout_s=120) as ep:
            return await run_session(ep, d, cfg, depth=2)

    return go()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    target, draft = h.write_models(root)
    return root, target, draft


@pytest.fixture(scope="module")
def pair(models):
    root, target, _ = models
    leader, follower = spawn_pair(root, target)
    try:
        yield leader, follower
    finally:
        leader.stop()
        follower.stop()


def test_tokens_equal_a_single_process_verifier(models, pair):
    _, target, draft = models
    leader, follower = pair

    async def remote():
        return await asyncio.gather(*(session_over(leader.address, draft, c) for c in SESSIONS))

    async def local():  # the servers' scheduler, one process, one device
        config = SchedulerConfig(max_sessions=8, max_len=128, max_gamma=4)
        v = LocalVerifier(jaxspec.load(target), config)
        try:
            return await asyncio.gather(
                *(
                    run_session(v, h.drafter(str(draft), c.draft.gamma, c.draft.encoding)
                                if c.draft.gamma else None, c, depth=2)
                    for c in SESSIONS
                )
            )  # fmt: skip
        finally:
            await v.aclose()

    t0 = time.monotonic()
    got = asyncio.run(remote())
    t1 = time.monotonic()
    want = asyncio.run(local())
    print(f"2 processes: {t1 - t0:.1f} s, 1 process: {time.monotonic() - t1:.1f} s")
    for cfg, g, w in zip(SESSIONS, got, want, strict=True):
        assert g.tokens == w.tokens, cfg
        assert len(g.tokens) > 0
    assert "no gRPC port (process 0 serves)" in follower.log, follower.log_tail()
    assert follower.alive(), follower.log_tail()


def test_a_drained_leader_stops_its_follower_cleanly(pair):
    leader, follower = pair
    t0 = time.monotonic()
    assert leader.stop() == 0, leader.log_tail()
    assert follower.proc.wait(30) == 0, follower.log_tail()
    assert time.monotonic() - t0 < 30
    assert "the leader stopped after" in follower.log, follower.log_tail()


def test_a_killed_follower_makes_the_leader_exit_nonzero(models):
    root, target, _ = models
    leader, follower = spawn_pair(
        root, target, "--heartbeat-timeout-s", str(HEARTBEAT_S), "--drain-min-s", "1"
    )
    try:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(leader.address))
        check = health_pb2.HealthCheckRequest(service="")
        assert health.Check(check, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        seen = set()
        t0 = time.monotonic()
        follower.kill()
        while leader.alive() and time.monotonic() - t0 < 60:
            try:
                seen.add(health.Check(check, timeout=1).status)
            except grpc.RpcError:
                pass  # the port closed: the leader is exiting
            time.sleep(0.05)
        assert leader.proc.wait(5) == multihost.EXIT_LOCKSTEP, leader.log_tail()
        elapsed = time.monotonic() - t0
        print(f"leader exited {elapsed:.1f} s after the follower was killed")
        assert elapsed < EXIT_BOUND_S, (elapsed, leader.log_tail())
        assert health_pb2.HealthCheckResponse.NOT_SERVING in seen, (seen, leader.log_tail())
        assert "process(es) [1] stopped sending heartbeats" in leader.log, leader.log_tail()
        assert "could not set health" not in leader.log, leader.log_tail()
    finally:
        leader.kill()
        follower.kill()


def test_a_follower_killed_mid_session_fails_the_session_and_the_leader(models):
    """Killed while steps are running: the leader's next collective fails at once (or the
    heartbeat catches it): the leader exits 3 and the session gets an error, no hang."""
    root, target, draft = models
    leader, follower = spawn_pair(root, target, "--heartbeat-timeout-s", str(HEARTBEAT_S))
    try:
        cfg = dataclasses.replace(SESSIONS[1], max_new_tokens=96)
        started, outcome = threading.Event(), {}

        def client() -> None:
            d = h.drafter(str(draft), cfg.draft.gamma, cfg.draft.encoding)

            async def go():
                async with GrpcEndpoint(leader.address, timeout_s=120) as ep:
                    return await run_session(
                        ep, d, cfg, depth=2, on_event=lambda kind, _: started.set()
                    )

            try:
                outcome["trace"] = asyncio.run(go())
            except Exception as e:  # what the edge sees when the verifier goes away
                outcome["error"] = e

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        assert started.wait(120), leader.log_tail()
        t0 = time.monotonic()
        follower.kill()
        assert leader.proc.wait(EXIT_BOUND_S) == multihost.EXIT_LOCKSTEP, leader.log_tail()
        thread.join(30)
        assert not thread.is_alive(), "the session hangs after the leader exited"
        assert "error" in outcome, outcome  # 96 tokens take far longer than the detection
        print(f"mid-session: leader exited {time.monotonic() - t0:.1f} s after the kill")
        assert "multi-host lockstep broken" in leader.log, leader.log_tail()
    finally:
        leader.kill()
        follower.kill()


def test_a_killed_leader_ends_its_follower_nonzero(models):
    """The coordination service lives in process 0: without it JAX ends a follower at once
    (it never waits for calls that cannot come)."""
    root, target, _ = models
    leader, follower = spawn_pair(root, target, "--heartbeat-timeout-s", str(HEARTBEAT_S))
    try:
        t0 = time.monotonic()
        leader.kill()
        code = follower.proc.wait(EXIT_BOUND_S)
        assert code != 0, follower.log_tail()
        print(f"follower exited {code} {time.monotonic() - t0:.1f} s after the leader's kill")
    finally:
        leader.kill()
        follower.kill()


# ---- refused at start: a mesh the model does not fit; the leader's reason, told ------------


def start_pair(root: pathlib.Path, target: pathlib.Path, *extra: str, port: int = 0):
    """A follower (process 1) and a leader (process 0 on `port`), started, not waited for."""
    coordinator = f"127.0.0.1:{h.free_port()}"
    flags = [
        "--checkpoint", str(target), *h.SERVER_FLAGS, "--coordinator", coordinator,
        "--num-processes", "2", *extra,
    ]  # fmt: skip
    env = h.server_env(root / "jax-cache", devices=4)
    follower = VerifierProcess([*flags, "--process-id", "1"], env=env).start()
    leader = VerifierProcess([*flags, "--process-id", "0"], port=port, env=env).start()
    return leader, follower


def test_a_mesh_that_does_not_divide_the_kv_heads_is_refused_before_loading(tmp_path):
    """SmolLM2's 3 KV heads and --mesh data=4,model=2: before, both processes loaded the
    target, failed on JAX's raw sharding error ("axis of size 3 partitioned 2 ways"), then
    said only that the coordination service was unreachable (exit 3). Now each refuses at
    start from the config (exit 2), naming the numbers and the meshes that fit."""
    from jaxspec.ckpts.tiny import byte_tokenizer, tiny_config, write_random_checkpoint

    tok = byte_tokenizer()
    config = tiny_config(
        vocab_size=len(tok), num_attention_heads=6, num_key_value_heads=3, intermediate_size=96,
        bos_token_id=tok.bos_token_id, eos_token_ids=(tok.eos_token_id,),
    )  # fmt: skip
    target = write_random_checkpoint(tmp_path / "three-kv-heads", config)
    leader, follower = start_pair(tmp_path, target, "--mesh", MESH)
    try:
        for p in (leader, follower):
            assert p.proc.wait(120) == 2, p.log_tail()
            log = p.log
            assert "--mesh data=4,model=2 does not fit" in log, log
            assert "model=2 does not divide num_key_value_heads=3" in log, log
            assert "model=1 or 3 would (with 8 devices: --mesh data=8,model=1)" in log, log
            assert "coordination service" not in log and "listening" not in log, log
    finally:
        leader.kill()
        follower.kill()
    # ...and the check itself: SmolLM2's sizes, a quantized copy's scale groups, the slots
    from verify.mesh import mesh_problem

    smollm2 = tiny_config(num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                          hidden_size=576, intermediate_size=1536)  # fmt: skip
    assert mesh_problem(smollm2, 2, 3, max_sessions=64) is None
    assert mesh_problem(smollm2, 8, 1, max_sessions=64) is None
    assert "data=3 does not divide them" in mesh_problem(smollm2, 3, 1, max_sessions=64)
    grouped = mesh_problem(smollm2, 4, 3, max_sessions=64, group_size=64)  # 9 groups of o_proj
    assert grouped is None, grouped
    grouped = mesh_problem(smollm2, 2, 3, max_sessions=64, group_size=256)  # ceil(576/256) = 3
    assert grouped is None, grouped
    eight = tiny_config(num_attention_heads=8, num_key_value_heads=8, intermediate_size=64)
    grouped = mesh_problem(eight, 1, 8, max_sessions=64, group_size=48)  # ceil(64/48) = 2
    assert "model=8 does not divide" in grouped and "down_proj's scale groups=2" in grouped


def test_a_follower_says_why_the_leader_left(models):
    """The leader cannot listen (its port is taken) after the processes joined: before, its
    follower said only that the coordination service was unreachable (it lives in the
    leader); now the leader tells it why before leaving."""
    import socket

    root, target, _ = models
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        leader, follower = start_pair(root, target, "--mesh", MESH, port=busy.getsockname()[1])
        try:
            assert leader.proc.wait(120) == 2, leader.log_tail()
            assert follower.proc.wait(60) == multihost.EXIT_LOCKSTEP, follower.log_tail()
        finally:
            leader.kill()
            follower.kill()
    assert "cannot listen on 127.0.0.1" in leader.log, leader.log_tail()
    said = "multi-host lockstep broken: the leader (process 0) stopped: cannot listen on"
    assert said in follower.log, follower.log_tail()
    assert "coordination service is unreachable" not in follower.log, follower.log_tail()


# ---- the lockstep's checks, without processes -----------------------------------------------


class FakeStore:
    """The coordination service's key-value calls the lockstep uses, in memory."""

    def __init__(self):
        self.kv: dict[str, bytes] = {}

    def key_value_set_bytes(self, key, value):
        self.kv[key] = value

    def blocking_key_value_get_bytes(self, key, timeout_ms):
        if key not in self.kv:
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.kv[key]

    def key_value_delete(self, key):
        self.kv.pop(key, None)

    def key_value_try_get_bytes(self, key):
        if key not in self.kv:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.kv[key]

    def key_value_dir_get_bytes(self, prefix):
        return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def follower_over(store: FakeStore) -> multihost.Lockstep:
    return multihost.Lockstep(make_mesh(1, 1), client=store, process=(1, 2))


def test_a_follower_refuses_a_call_out_of_sequence():
    store = FakeStore()
    store.kv["jaxspec/lockstep/1"] = multihost._encode(2, "stop", [])  # call 2 where 1 is due
    with pytest.raises(multihost.LockstepBroken, match="expected call 1, the leader sent 2"):
        follower_over(store).follow(scheduler=None)


def test_a_follower_refuses_an_unknown_call():
    store = FakeStore()
    store.kv["jaxspec/lockstep/1"] = multihost._encode(1, "prefill", [np.zeros(2)])
    with pytest.raises(multihost.LockstepBroken, match="not registered"):
        follower_over(store).follow(scheduler=None)  # no "prefill" was wrapped here
    buf = io.BytesIO()
    np.savez(buf, meta=np.array([1, 7, 0]))
    store.kv["jaxspec/lockstep/1"] = zlib.compress(buf.getvalue())
    with pytest.raises(RuntimeError, match="unknown call 7"):
        follower_over(store).follow(scheduler=None)


def test_a_follower_asked_to_stop_gives_up_when_the_leader_says_nothing():
    t0 = time.monotonic()
    with pytest.raises(multihost.LockstepBroken, match="asked to stop"):
        follower_over(FakeStore()).follow(scheduler=None, deadline=lambda: time.monotonic() - 1)
    assert time.monotonic() - t0 < 5


def test_the_stop_message_ends_a_follower_with_zero():
    store = FakeStore()
    store.kv["jaxspec/lockstep/1"] = multihost._encode(1, "stop", [])
    follower = follower_over(store)
    assert follower.follow(scheduler=None) == 0
    assert follower.calls == 1


def test_a_follower_hears_why_the_leader_stopped():
    store = FakeStore()
    leader = multihost.Lockstep(make_mesh(1, 1), client=store, process=(0, 2))
    t0 = time.monotonic()
    leader.abort("cannot listen on 127.0.0.1:1: taken", wait_s=0.5)  # nobody heard: gives up
    assert 0.5 <= time.monotonic() - t0 < 5
    assert store.kv["jaxspec/lockstep/abort"] == b"cannot listen on 127.0.0.1:1: taken"
    with pytest.raises(multihost.LockstepBroken, match=r"^the leader \(process 0\) stopped: "):
        follower_over(store).follow(scheduler=None)  # no call comes: it hears why instead
    assert "jaxspec/lockstep/abort/heard/1" in store.kv  # ...and says it heard
    leader._stopping.clear()
    t0 = time.monotonic()
    leader.abort("again", wait_s=30)  # every follower has heard: no wait
    assert time.monotonic() - t0 < 5
