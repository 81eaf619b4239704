"""`python -m verify serve` start-up: flags refused before anything loads, the port bound
before the warm-up (a busy one fails at once), NOT_SERVING / UNAVAILABLE "warming up" until
the verifier is ready, warm-up progress, the compilation cache's directory, the example
tenants file, and an idempotent CloseSession (a normal end is not a refusal)."""

from __future__ import annotations

import asyncio
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jaxspec.ckpts.tiny import tiny_config
from jaxspec.compilation.shapes import warmup_shapes
from jaxspec.nn.model import Model, init_params
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import wire
from jaxspec_host.xla_cache import compilation_cache_dir
from tests import grpc_helpers as h
from verify import LocalVerifier, Scheduler, SchedulerConfig
from verify.__main__ import build_parser, refuse_insecure_public
from verify.process import VerifierProcess
from verify.scheduler import WarmupCancelled
from verify.serve import bind, insecure_public_reason, is_loopback
from verify.tenants import Tenant, Tenants, token_sha256

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "verify", "serve", "--pair", "tiny"]  # never SmolLM2 here


def serve(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run `python -m verify serve ARGS` to its end: (the process, seconds it took)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [*SERVE, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    return proc, time.monotonic() - t0


# ---- a public address needs tenants and TLS ----------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("example.org", False), ("", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ([], True),
        (["--tenants", "t.toml"], True),  # tokens in the clear
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], True),  # anyone may use it
        (["--tenants", "t.toml", "--tls-cert", "c.pem", "--tls-key", "k.pem"], False),
        (["--allow-insecure-public"], False),
    ],
)
def test_a_public_host_needs_tenants_and_tls_or_the_explicit_flag(extra, refused):
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", *extra])
    reason = refuse_insecure_public(args)
    assert (reason is not None) is refused
    if refused:
        assert "--allow-insecure-public" in reason and "0.0.0.0" in reason
    loopback = build_parser().parse_args(["serve", "--host", "127.0.0.1", *extra])
    assert refuse_insecure_public(loopback) is None
    assert insecure_public_reason("localhost", tenants=False, tls=False) is None


def test_serve_refuses_a_public_host_before_loading_anything(tmp_path):
    """Exit 2 naming the flag; the missing checkpoint is never looked at. With the flag the
    same command goes on (and fails on the checkpoint instead)."""
    missing = str(tmp_path / "no-such-checkpoint")
    proc, _ = serve("--host", "0.0.0.0", "--port", "0", "--checkpoint", missing)
    assert proc.returncode == 2, proc.stderr
    assert "--allow-insecure-public" in proc.stderr and "0.0.0.0" in proc.stderr
    assert "no-such-checkpoint" not in proc.stderr and "listening" not in proc.stdout
    proc, _ = serve(
        "--host", "0.0.0.0", "--port", "0", "--checkpoint", missing, "--allow-insecure-public"
    )
    assert proc.returncode == 2 and "no-such-checkpoint" in proc.stderr, proc.stderr
    assert "--allow-insecure-public" not in proc.stderr


# ---- the port first ---------------------------------------------------------------------------


def test_a_busy_port_fails_at_once_not_after_the_warm_up():
    """The shipped target with its default flags has 63 shapes to compile (minutes
    here): a server that bound its port only after them would run past the limit."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc, took = serve("--port", str(port), "--compilation-cache", "none", timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Address already in use" in proc.stderr and "--port" in proc.stderr
    assert "add_port" not in proc.stderr  # gRPC core's own log line is not printed first
    assert not re.search(r"^[EW]\d{4} ", proc.stderr, re.M), proc.stderr  # no gRPC core lines
    assert "warm-up:" not in proc.stderr and "listening" not in proc.stdout
    assert took < 60


def test_not_serving_while_warming_up_and_sigterm_stops_the_warm_up():
    """The real command: "listening" printed at once, then health NOT_SERVING and
    OpenSession UNAVAILABLE "warming up" while the shipped target's 63 shapes compile (the
    cache off, so they do compile); SIGTERM then ends it after the shape in progress."""
    server = VerifierProcess(["--pair", "tiny", "--compilation-cache", "none"], port=h.free_port())
    with server:
        deadline = time.monotonic() + 120
        while "jaxspec verifier listening on" not in server.log:
            assert server.alive() and time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        # 7 row x 4 width buckets (1, 3, 5, 9) x 2 KV buckets (256, 512) steps, 7 prefills
        assert "warming up: 63 shapes" in server.log
        ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", "jaxspec.v1.Verifier"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.VerifierStub(ch).OpenSession(wire.config_to_proto(h.config()), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "warming up" in e.value.details()
        stats = pb_grpc.VerifierStub(ch).Stats(pb.StatsRequest(), timeout=10)  # answers now
        assert not stats.serving and stats.warming_total == 63 and stats.warming_done < 63
        assert "jaxspec verifier serving" not in server.log  # still warming up
        server.signal(signal.SIGTERM)
        assert server.proc.wait(120) == 0, server.log_tail()
    assert "interrupted while warming up" in server.log
    assert "jaxspec verifier serving" not in server.log


# ---- warming up, in process -------------------------------------------------------------------

TENANTS = {"alice": "alice-token", "bob": "bob-token"}


def tiny_verifier(config: SchedulerConfig) -> LocalVerifier:
    cfg = tiny_config()
    return LocalVerifier(Model(config=cfg, params=init_params(cfg, 0)), config)


def test_warm_up_reports_each_shape_and_can_be_stopped():
    config = SchedulerConfig(max_sessions=2, max_len=64, max_gamma=2)  # rows 1, 2; widths 1, 3
    assert warmup_shapes(config) == [
        ("step", 1, 1, 64), ("step", 1, 3, 64), ("step", 2, 1, 64), ("step", 2, 3, 64),
        ("prefill", 1, 64, 64), ("prefill", 2, 64, 64),
    ]  # fmt: skip
    long = SchedulerConfig(max_sessions=1, max_len=256, max_gamma=2)  # KV: half, whole slot
    assert [s for s in warmup_shapes(long) if s[0] == "step"] == [
        ("step", 1, 1, 128), ("step", 1, 3, 128), ("step", 1, 1, 256), ("step", 1, 3, 256),
    ]  # fmt: skip
    config = SchedulerConfig(max_sessions=1, max_len=64, max_gamma=2)  # three shapes to compile
    cfg = tiny_config()
    sched = Scheduler(Model(config=cfg, params=init_params(cfg, 0)), config)
    seen = []

    def stop_after_one(done, total, shape):
        seen.append((done, total, shape))
        raise WarmupCancelled

    with pytest.raises(WarmupCancelled):
        sched.warmup(stop_after_one)
    assert seen == [(1, 3, "step 1x1x64")]
    sched.warmup(lambda *a: seen.append(a))
    assert seen[1:] == [(1, 3, "step 1x1x64"), (2, 3, "step 1x3x64"), (3, 3, "prefill 1x64")]


def test_a_shape_compiled_ahead_of_time_is_not_compiled_again_at_first_use():
    """What the verifier compiles in the background while it serves (`precompile`) is what
    its first real call of that shape runs: the lowering carried a sharding where the live
    KV cache had none (uncommitted), so jit keyed the real call apart and compiled every
    such shape a second time at first use (3 s a shape here, a second copy of its code in
    memory: 27,054 memory maps for SmolLM2's 63 shapes)."""
    import jax.monitoring

    config = SchedulerConfig(max_sessions=1, max_len=72, max_gamma=2)  # shapes of its own
    cfg = tiny_config()
    sched = Scheduler(Model(config=cfg, params=init_params(cfg, 0)), config)
    sched.warmup(None, [("step", 1, 1, 72)])  # a real step first: the cache is a step's output
    got = []  # an executable obtained: compiled, or loaded from the persistent cache

    def compiled(event: str, _secs: float, **_kw) -> None:
        if event.endswith("backend_compile_duration"):
            got.append(event)

    def loaded(event: str, **_kw) -> None:
        if event.endswith("cache_hits"):
            got.append(event)

    jax.monitoring.register_event_duration_secs_listener(compiled)
    jax.monitoring.register_event_listener(loaded)
    try:
        for shape in (("step", 1, 3, 72), ("prefill", 1, 64, 72)):
            sched.precompile(*sched.precompile_args(shape))
        ahead = len(got)
        sched.warmup(None, [("step", 1, 3, 72), ("prefill", 1, 64, 72)])  # real calls
    finally:
        jax.monitoring.unregister_event_duration_listener(compiled)
        jax.monitoring.unregister_event_listener(loaded)
    assert ahead >= 2 and len(got) == ahead, got  # (jnp.zeros compiles too)


def test_bound_server_answers_warming_up_until_ready_then_closes_idempotently():
    """Before `ready()`: health NOT_SERVING, OpenSession/Verify/CloseSession UNAVAILABLE
    "warming up", Stats not serving. After: SERVING; closing a session twice is OK for its
    tenant and not a refusal; another tenant's or an unknown id is NOT_FOUND."""
    config = SchedulerConfig(max_sessions=2, max_len=64, max_gamma=2)
    tenants = Tenants([Tenant(name, token_sha256(t)) for name, t in TENANTS.items()])

    def md(name):
        return (("authorization", f"Bearer {TENANTS[name]}"),)

    async def go():
        server = await bind(config, tiny_config().vocab_size, tenants=tenants)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                health = health_pb2_grpc.HealthStub(ch)
                stub = pb_grpc.VerifierStub(ch)
                for name in ("", "jaxspec.v1.Verifier"):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
                    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
                cfg = wire.config_to_proto(h.config(prompt=(1, 2), gamma=2))
                nobody = pb.CloseSessionRequest(session_id="0" * 32)
                blocks = iter([pb.VerifyRequest(block=pb.DraftBlock(tokens=[1]))])
                calls = [
                    lambda: stub.OpenSession(cfg, metadata=md("alice")),
                    lambda: stub.CloseSession(nobody, metadata=md("alice")),
                    lambda: stub.Verify(blocks, metadata=md("alice")).read(),
                ]
                for call in calls:
                    with pytest.raises(grpc.RpcError) as e:
                        await call()
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "warming up" in e.value.details()
                stats = await stub.Stats(pb.StatsRequest(), metadata=md("alice"))
                assert not stats.serving and stats.sessions == 0
                assert (stats.warming_done, stats.warming_total) == (0, 0)  # nothing reported
                server.warming(0, 4)
                server.warming(1, 4)  # what the warm-up reports, shape by shape
                stats = await stub.Stats(pb.StatsRequest(), metadata=md("bob"))
                assert (stats.warming_done, stats.warming_total) == (1, 4)
                assert not stats.serving
                for bad in ((5, 4), (-1, 4)):
                    with pytest.raises(ValueError, match="done <= total"):
                        server.warming(*bad)

                verifier = tiny_verifier(config)
                await server.ready(verifier)
                reply = await health.Check(health_pb2.HealthCheckRequest())
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                stats = await stub.Stats(pb.StatsRequest(), metadata=md("alice"))
                assert stats.serving and (stats.warming_done, stats.warming_total) == (1, 4)

                # Sessions opened in the scheduler directly: no prefill, nothing compiles.
                core = h.config(prompt=(1, 2), gamma=2)
                sid = verifier.scheduler.open(core, "alice").session_id
                other = verifier.scheduler.open(core, "alice").session_id
                close = pb.CloseSessionRequest(session_id=sid)
                await stub.CloseSession(close, metadata=md("alice"))
                await stub.CloseSession(close, metadata=md("alice"))  # again: a normal end
                for who, session in (("bob", sid), ("bob", other), ("alice", "0" * 32)):
                    with pytest.raises(grpc.RpcError) as e:
                        await stub.CloseSession(
                            pb.CloseSessionRequest(session_id=session), metadata=md(who)
                        )
                    assert e.value.code() == grpc.StatusCode.NOT_FOUND
                assert other in verifier.scheduler.sessions  # bob could not close it
        finally:
            await server.stop()
        rejected = {
            (s.labels["method"], s.labels["status"]): s.value
            for m in server.service.metrics.registry.collect()
            for s in m.samples
            if s.name == "jaxspec_rejected_requests_total"
        }
        warm = {
            s.name: s.value
            for m in server.service.metrics.registry.collect()
            for s in m.samples
            if s.name.startswith("jaxspec_warmup")
        }
        assert warm == {"jaxspec_warmup_shapes_compiled": 1, "jaxspec_warmup_shapes": 4}
        return rejected

    rejected = asyncio.run(go())
    assert rejected == {
        ("OpenSession", "UNAVAILABLE"): 1,
        ("CloseSession", "UNAVAILABLE"): 1,
        ("Verify", "UNAVAILABLE"): 1,
        ("CloseSession", "NOT_FOUND"): 3,  # not the second close of alice's own session
    }


# ---- the compilation cache ---------------------------------------------------------------------


def test_compilation_cache_directory_flag_then_environment_then_per_user(tmp_path):
    env = {"JAX_COMPILATION_CACHE_DIR": "/from/env", "XDG_CACHE_HOME": str(tmp_path)}
    assert compilation_cache_dir("/from/flag", env) == "/from/flag"
    assert compilation_cache_dir("none", env) is None
    assert compilation_cache_dir(None, env) == "/from/env"
    per_user = str(tmp_path / "jaxspec" / "xla")
    assert compilation_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path)}) == per_user
    assert compilation_cache_dir(None, {"JAX_COMPILATION_CACHE_DIR": "", **env}) == "/from/env"
    home = str(pathlib.Path.home() / ".cache" / "jaxspec" / "xla")
    assert compilation_cache_dir(None, {"XDG_CACHE_HOME": "relative/ignored"}) == home
    assert compilation_cache_dir(None, {}) == home


# ---- the example tenants file -------------------------------------------------------------------


def test_the_example_tenants_file_loads_and_authenticates():
    tenants = Tenants.load(ROOT / "docs" / "tenants.example.toml")
    by_name = {t.name: t for t in tenants.by_hash.values()}
    assert set(by_name) == {"alice", "bob", "batch-jobs", "ops"}
    assert [n for n, t in by_name.items() if t.admin] == ["ops"]
    assert (by_name["alice"].max_sessions, by_name["alice"].tokens_per_s) == (16, 400.0)
    assert (by_name["bob"].max_sessions, by_name["bob"].tokens_per_s) == (4, 0.0)
    for name, token in [
        ("alice", "replace-me-alice-0123456789abcdef"),
        ("bob", "replace-me-bob-0123456789abcdef"),  # the file holds only its digest
    ]:
        assert tenants.identify([("authorization", f"Bearer {token}")]).name == name
    assert tenants.identify([("authorization", "Bearer not-in-the-file")]) is None


# ---- serving before the last shape is compiled (issue 30) ----------------------------------


def test_serves_after_the_first_bucket_and_compiles_the_rest_in_the_background(tmp_path):
    """The real command: shapes in the order first requests need them (the smallest row
    bucket's prefill, then its steps), "serving" right after those, the rest compiled in the
    background ("fully warm" at the end); a session run meanwhile gets exactly the tokens of
    an in-process verifier (a compilation never runs beside a step)."""
    from jaxspec.compilation.shapes import warmup_order

    config = SchedulerConfig(max_sessions=8, max_gamma=4, max_len=128)
    order = warmup_order(config)
    assert order[:4] == [("prefill", 1, 64, 128), ("step", 1, 5, 128), ("step", 1, 3, 128),
                         ("step", 1, 1, 128)]  # fmt: skip
    assert sorted(order) == sorted(warmup_shapes(config)) and len(order) == 16

    target, draft = h.write_models(tmp_path)  # rows 1, 2 x widths 1, 3: 6 shapes, 3 first
    flags = ["--checkpoint", str(target), "--max-sessions", "2", "--max-gamma", "2",
             "--max-len", "128", "--compilation-cache", "none"]  # fmt: skip
    cfg = h.config(mode="sync", gamma=2, seed=3)
    with VerifierProcess(flags) as server:
        address = server.wait_ready(180)
        got = h.run(h.session(address, draft, cfg))
        deadline = time.monotonic() + 180
        while "fully warm" not in server.log:
            assert server.alive() and time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        with grpc.insecure_channel(address) as ch:
            stats = pb_grpc.VerifierStub(ch).Stats(pb.StatsRequest(), timeout=10)
        assert (stats.warming_done, stats.warming_total) == (6, 6)  # counted past "serving"
    log = server.log
    assert "warming up: 6 shapes, serving after the first 3" in log
    before = log[: log.index("jaxspec verifier serving")]
    assert re.findall(r"warm-up: (\d+)/6", before) == ["1", "2", "3"], log
    assert "partially warm: serving with 3/6 shapes" in before
    after = log[log.index("jaxspec verifier serving") :]
    assert re.findall(r"warm-up: (\d+)/6", after) == ["4", "5", "6"], log
    assert "fully warm: 6 shapes" in after
    want = h.run(h.local_session(target, draft, cfg))
    assert got.tokens == want.tokens and len(got.tokens) > 0


def test_close_session_returns_once_the_verifier_has_freed_the_slot(monkeypatch):
    """`GrpcEndpoint.close_session` half-closes and waits for the stream's end, which the
    verifier sends after freeing the slot: a tenant at its limit (1 live session) opens
    again at once even when the release is slow (here 0.5 s). A close that only cancels the
    stream (the mutant, what the client did before) returns first and the open is refused."""
    from edge.client import GrpcEndpoint
    from jaxspec.protocol import ResourceExhausted
    from verify.local import TenantEndpoint

    config = SchedulerConfig(max_sessions=2, max_len=64, max_gamma=2)
    tenants = Tenants([Tenant("carol", token_sha256(TENANTS["alice"]), max_sessions=1)])
    release = TenantEndpoint.close_session

    async def slow_release(self, session_id):
        await asyncio.sleep(0.5)
        await release(self, session_id)

    monkeypatch.setattr(TenantEndpoint, "close_session", slow_release)

    async def cancel_only(self, session_id):
        await self._end_stream(session_id)

    async def go(close):
        server = await bind(config, tiny_config().vocab_size, tenants=tenants)
        await server.ready(tiny_verifier(config))
        try:
            address = f"127.0.0.1:{server.port}"
            async with GrpcEndpoint(address, token=TENANTS["alice"], timeout_s=30) as ep:
                cfg = h.config(prompt=(1, 2), gamma=2)
                for _ in range(2):
                    info = await ep.open_session(cfg)
                    await close(ep, info.session_id)
        finally:
            await server.stop(0)

    asyncio.run(go(GrpcEndpoint.close_session))
    with pytest.raises(ResourceExhausted, match="tenant limit of 1"):
        asyncio.run(go(cancel_only))
