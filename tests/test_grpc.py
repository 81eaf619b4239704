"""The gRPC verifier service against real clients: one TLS server with three tenants on a
loopback port (a `python -m verify serve` subprocess) for the whole module."""

from __future__ import annotations

import asyncio
import filecmp
import pathlib
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import numpy as np
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import jaxspec
from edge.client import error_from_rpc
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import NotFound, ResourceExhausted, Unauthenticated, wire
from tests import grpc_helpers as h
from verify.process import VerifierProcess

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 258  # the byte tokenizer of jaxspec.ckpts.tiny
ALLOWED_OPEN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
ALLOWED_VERIFY = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc")
    target, draft, cert, server = h.spawn_tls_tenants(root)
    try:
        yield dict(
            root=root, target=target, draft=draft, ca=cert, server=server,
            address=f"localhost:{server.port}",
        )  # fmt: skip
    finally:
        assert server.stop() == 0, server.log[-3000:]


def client(world, tenant, cfg, **kw):
    return h.session(world["address"], world["draft"], cfg, h.TOKENS[tenant], world["ca"], **kw)


def stub(world):
    return pb_grpc.VerifierStub(h.channel(world["address"], world["ca"]))


def live_sessions(world) -> int:
    """Every tenant's live sessions (the admin tenant's Stats)."""
    return stub(world).Stats(pb.StatsRequest(), metadata=h.auth("ops")).sessions


BOB_CFG = h.BOB_CFG


@pytest.fixture(scope="module")
def bob_reference(world):
    return h.run(client(world, "bob", BOB_CFG)).tokens


def test_checked_in_stubs_match_the_proto(tmp_path):
    from grpc_tools import protoc

    rel = "jaxspec/proto/verifier.proto"
    args = ["protoc", f"-I{ROOT}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main([*args, f"--grpc_python_out={tmp_path}", str(ROOT / rel)]) == 0
    for name in ("verifier_pb2.py", "verifier_pb2.pyi", "verifier_pb2_grpc.py"):
        fresh = tmp_path / "jaxspec" / "proto" / name
        assert filecmp.cmp(fresh, ROOT / "jaxspec" / "proto" / name, shallow=False), name


# min-p and a logit bias travel with the session and apply on both sides.
OPTIONS = dict(min_p=0.05, logit_bias=((3, 2.0), (0, -3.0)))


@pytest.mark.parametrize(
    ("mode", "encoding", "temperature", "options"),
    [
        ("pipelined", "full", 1.0, {}),
        ("sync", "sparse", 0.7, {}),
        ("pipelined", "onehot", 0.0, {}),
        ("sync", "full", 1.0, OPTIONS),
        ("pipelined", "onehot", 0.0, {"logit_bias": ((7, 3.0),)}),
    ],
)
def test_session_over_tls_equals_in_process(world, mode, encoding, temperature, options):
    """The wire changes nothing: same tokens as the in-process LocalVerifier."""
    cfg = h.config(mode=mode, encoding=encoding, temperature=temperature, seed=5, **options)
    over_grpc = h.run(client(world, "alice", cfg))
    assert 0 < len(over_grpc.tokens) <= cfg.max_new_tokens
    assert over_grpc.figures.rounds > 0 and 0 <= over_grpc.figures.acceptance_rate <= 1

    assert over_grpc.tokens == h.run(h.local_session(world["target"], world["draft"], cfg)).tokens


def test_gamma0_over_tls_is_plain_decoding_beside_a_speculative_session(world, bob_reference):
    """gamma 0 (speculation off) through the same service and stream kind, while another
    tenant speculates: the tokens are plain decoding's (the verifier's own draws), the
    figures count no draft, and the other session is unchanged."""
    cfg = h.config(gamma=0, mode="pipelined", temperature=1.0, seed=9)

    async def both():
        return await asyncio.gather(client(world, "alice", cfg), client(world, "bob", BOB_CFG))

    plain, bob = h.run(both())
    target = jaxspec.load(world["target"])
    want = jaxspec.generate(target, list(cfg.prompt), cfg.max_new_tokens, seeds=[9]).tokens
    assert plain.tokens == want and plain.figures.rounds == len(want)
    assert plain.figures.num_draft_tokens == 0 and plain.figures.num_drafts == 0
    assert bob.tokens == bob_reference and bob.figures.num_drafts == bob.figures.rounds


def test_the_port_is_bound_and_said_so_before_serving(world):
    log = world["server"].log
    listening = log.index(f"jaxspec verifier listening on 127.0.0.1:{world['server'].port} (TLS)")
    assert listening < log.index("jaxspec verifier serving")
    assert "warming up: 0 shapes (--no-warmup)" in log


def test_health_is_serving_and_reflection_is_off(world):
    ch = h.channel(world["address"], world["ca"])
    health = health_pb2_grpc.HealthStub(ch)
    for service in ("", "jaxspec.v1.Verifier"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    with pytest.raises(grpc.RpcError) as e:
        list(reflect(iter([b""]), timeout=10))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_plaintext_client_cannot_reach_the_tls_server(world):
    ch = grpc.insecure_channel(world["address"])
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.VerifierStub(ch).Stats(pb.StatsRequest(), metadata=h.auth("alice"), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("token", [None, "wrong-token", ""])
def test_every_rpc_refuses_a_missing_or_invalid_token_before_any_state(world, token):
    s = stub(world)
    md = () if token is None else (("authorization", f"Bearer {token}"),)
    before = live_sessions(world)
    calls = [
        lambda: s.OpenSession(wire.config_to_proto(h.config()), metadata=md, timeout=10),
        lambda: s.CloseSession(pb.CloseSessionRequest(session_id="00" * 16), metadata=md),
        lambda: s.Stats(pb.StatsRequest(), metadata=md, timeout=10),
        lambda: list(
            s.Verify(
                iter([pb.VerifyRequest(block=pb.DraftBlock(tokens=[1]))]), metadata=md, timeout=10
            )
        ),
        lambda: list(
            s.Verify(
                iter([pb.VerifyRequest(open=wire.config_to_proto(h.config()))]),
                metadata=md,
                timeout=10,
            )
        ),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "secret" not in (e.value.details() or "")
    assert live_sessions(world) == before
    assert "secret-token" not in world["server"].log  # tokens are never logged


async def attach(ep, block) -> None:
    """Send `block` as the first message of a new Verify stream of `ep` (a session opened
    elsewhere, named by its id): the protocol error it ends with."""
    call = ep.stub.Verify(metadata=ep.metadata)
    try:
        await call.write(pb.VerifyRequest(block=wire.block_to_proto(block)))
        await call.read()
    except grpc.RpcError as e:
        raise error_from_rpc(e) from None
    finally:
        call.cancel()


def test_tenants_are_isolated(world, bob_reference):
    """Bob cannot read, advance or close Alice's session: her id answers him exactly like an
    unknown id; her session is untouched. And Bob's output is what it is alone."""

    async def go():
        a = h.endpoint(world["address"], h.TOKENS["alice"], world["ca"])
        b = h.endpoint(world["address"], h.TOKENS["bob"], world["ca"])
        async with a, b:
            info = await a.open_session(h.config(seed=1))
            sid, unknown = info.session_id, secrets.token_hex(16)
            errors = []
            for target in (sid, unknown):
                block = jaxspec.protocol.DraftBlock(
                    session_id=target, epoch=0, start=4, tokens=(1,), q=np.eye(VOCAB)[[1]]
                )
                close = pb.CloseSessionRequest(session_id=target)
                for call in (b._unary(b.stub.CloseSession, close), attach(b, block)):
                    try:
                        await call
                    except NotFound as e:
                        errors.append(str(e))
            assert len(errors) == 4 and len(set(errors)) == 1  # indistinguishable
            # Alice's session is intact: she can still verify at start 4, epoch 0.
            r = await a.verify(
                jaxspec.protocol.DraftBlock(
                    session_id=sid, epoch=0, start=4, tokens=(1,), q=np.eye(VOCAB)[[1]]
                )
            )
            assert not r.stale and r.start == 4
            await a.close_session(sid)

    h.run(go())
    assert h.run(client(world, "bob", BOB_CFG)).tokens == bob_reference


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_fleet_target_over_tls_gives_the_same_session(world, bob_reference, host):
    """A fleet list (here the one server twice: two subchannels) over TLS: the certificate is
    checked against the name given (localhost) or the address, and the session is unchanged."""
    address = f"{host}:{world['server'].port}"
    fleet = f"{address},{address}"
    trace = h.run(h.session(fleet, world["draft"], BOB_CFG, h.TOKENS["bob"], world["ca"]))
    assert trace.tokens == bob_reference


def test_per_tenant_session_limit_and_rate_limit(world):
    async def go():
        async with h.endpoint(world["address"], h.TOKENS["carol"], world["ca"]) as ep:
            info = await ep.open_session(h.config())
            with pytest.raises(ResourceExhausted):
                await ep.open_session(h.config())
            await ep.close_session(info.session_id)

    h.run(go())
    # carol may verify 40 positions/s (bursts of 40): 16 blocks of 4 drafts cost 80.
    cfg = h.config(max_new_tokens=64, mode="sync", gamma=4, temperature=0.0, seed=2)
    t0 = time.monotonic()
    trace = h.run(client(world, "carol", cfg))
    cost = 5 * trace.blocks_sent
    assert time.monotonic() - t0 >= (cost - 40) / 40 * 0.95


def test_a_closed_session_has_freed_its_slot(world):
    """close_session returns once the verifier has freed the slot: carol (one live session)
    opens again at once, every time (a cancel-only close raced the verifier's release)."""

    async def go():
        for _ in range(10):  # a new channel each time: the next open takes another connection
            async with h.endpoint(world["address"], h.TOKENS["carol"], world["ca"]) as ep:
                info = await ep.open_session(h.config())
                await ep.close_session(info.session_id)

    h.run(go())


def test_oversized_messages_are_refused(world):
    s = stub(world)
    sid = s.OpenSession(
        wire.config_to_proto(h.config()), metadata=h.auth("alice"), timeout=10
    ).session_id
    huge = pb.DraftBlock(session_id=sid, start=4, tokens=[1], q=[0.0] * 2_000_000)
    with pytest.raises(grpc.RpcError) as e:
        list(s.Verify(iter([pb.VerifyRequest(block=huge)]), metadata=h.auth("alice"), timeout=10))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    s.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=h.auth("alice"))


# ---- fuzzing ------------------------------------------------------------------------------

floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
ints = st.one_of(st.integers(-3, VOCAB + 3), st.integers(-(2**31), 2**31 - 1))


@st.composite
def open_requests(draw):
    return pb.OpenSessionRequest(
        prompt=draw(st.lists(st.one_of(st.integers(0, VOCAB - 1), ints), max_size=6)),
        max_new_tokens=draw(st.one_of(st.integers(0, 100), st.integers(0, 2**32 - 1))),
        temperature=draw(st.one_of(floats, st.sampled_from([0.0, 0.7, 1.0]))),
        top_k=draw(st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1))),
        top_p=draw(st.one_of(floats, st.sampled_from([0.0, 0.9, 1.0]))),
        seed=draw(st.integers(0, 2**64 - 1)),
        mode=draw(st.integers(0, 5)),
        gamma=draw(st.integers(0, 9)),
        encoding=draw(st.integers(0, 5)),
        sparse_k=draw(st.integers(0, 40)),
        stop_tokens=draw(st.lists(ints, max_size=3)),
        default_stop_tokens=draw(st.booleans()),
        committed=draw(st.lists(st.one_of(st.integers(0, VOCAB - 1), ints), max_size=4)),
    )


@st.composite
def draft_blocks(draw, sessions):
    """Mostly near-valid blocks for the fuzz sessions, each with a few fields spoiled."""
    sid, enc, epoch, start = draw(st.sampled_from(sessions))
    n = draw(st.integers(0, 6))
    k = VOCAB if enc == "full" else 4
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    q = rng.dirichlet(np.ones(k), n).astype(np.float32)
    spoil = draw(st.sampled_from(["none", "none", "value", "scale", "short", "empty"]))
    if spoil == "value" and q.size:
        q.flat[draw(st.integers(0, q.size - 1))] = draw(floats)
    elif spoil == "scale":
        q *= draw(floats)
    q = q.ravel().tolist()
    if spoil == "short":
        q = q[: draw(st.integers(0, len(q)))]
    elif spoil == "empty" or (enc == "onehot" and draw(st.booleans())):
        q = []
    ids = [rng.choice(VOCAB, k, replace=False).tolist() for _ in range(n)]
    q_ids = [i for row in ids for i in row] if enc == "sparse" else []
    if draw(st.booleans()) and q_ids:
        q_ids[draw(st.integers(0, len(q_ids) - 1))] = draw(ints)
    tokens = draw(st.lists(st.one_of(st.integers(0, VOCAB - 1), ints), min_size=n, max_size=n))
    if enc == "sparse" and draw(st.booleans()):  # drafts among their rows' ids
        tokens = [r[0] for r in ids]
    return pb.DraftBlock(
        session_id=draw(st.sampled_from([sid, sid, secrets.token_hex(16), ""])),
        epoch=draw(st.sampled_from([epoch, epoch, epoch + 1, 2**32 - 1])),
        start=draw(st.sampled_from([start, start, start + 1, 0, 2**32 - 1])),
        tokens=tokens,
        q=q,
        q_ids=q_ids,
    )


def test_fuzzed_messages_get_only_documented_statuses(world, bob_reference):
    """While Bob runs a session, Alice sends fuzzed OpenSession requests and DraftBlocks.
    Every answer is OK or a documented status; the server stays healthy and Bob's output
    is exactly what it was without the fuzz."""
    s, md = stub(world), h.auth("alice")
    bob: list = []
    thread = threading.Thread(target=lambda: bob.append(h.run(client(world, "bob", BOB_CFG))))
    thread.start()
    seen: dict[str, int] = {}

    # derandomized: the examples are fixed, so the coverage asserted below is too
    @settings(max_examples=60, database=None, derandomize=True)
    @given(open_requests(), st.booleans())
    def fuzz_open(req, in_stream):
        try:
            if in_stream:  # the stream's first message opens it; its end closes it
                (r,) = s.Verify(iter([pb.VerifyRequest(open=req)]), metadata=md, timeout=20)
                assert r.WhichOneof("kind") == "opened" and r.opened.session_id
            else:
                sid = s.OpenSession(req, metadata=md, timeout=20).session_id
        except grpc.RpcError as e:
            assert e.code() in ALLOWED_OPEN, (e.code(), e.details())
            seen[e.code().name] = seen.get(e.code().name, 0) + 1
            return
        seen["OK"] = seen.get("OK", 0) + 1
        if not in_stream:
            s.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=md, timeout=20)

    fuzz_open()

    @settings(max_examples=120, database=None, derandomize=True)
    @given(st.data())
    def fuzz_blocks(data):
        enc = data.draw(st.sampled_from(["full", "sparse", "onehot"]))
        cfg = wire.config_to_proto(h.config(encoding=enc))
        sid = s.OpenSession(cfg, metadata=md, timeout=20).session_id
        outcome = None
        try:
            block = data.draw(draft_blocks([(sid, enc, 0, 4)]))
            try:
                (r,) = list(
                    s.Verify(iter([pb.VerifyRequest(block=block)]), metadata=md, timeout=20)
                )
                r = r.result
                outcome = "stale" if r.stale else "OK"
            except grpc.RpcError as e:
                assert e.code() in ALLOWED_VERIFY, (e.code(), e.details())
                outcome = e.code().name
            seen[outcome] = seen.get(outcome, 0) + 1
        finally:
            # An error status leaves the session open; a stream that ends normally closes
            # it (by the time its status reached us). An empty block tells which: NOT_FOUND
            # for a closed session, INVALID_ARGUMENT (and still open) for a live one.
            probe = pb.VerifyRequest(block=pb.DraftBlock(session_id=sid))
            with pytest.raises(grpc.RpcError) as e:
                list(s.Verify(iter([probe]), metadata=md, timeout=20))
            assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
            closed_by_stream = e.value.code() == grpc.StatusCode.NOT_FOUND
            # Closing answers OK either way: a session its tenant already ended is closed.
            s.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=md, timeout=20)
        assert closed_by_stream == (outcome in ("OK", "stale")), outcome

    fuzz_blocks()
    thread.join()
    assert bob[0].tokens == bob_reference
    health = health_pb2_grpc.HealthStub(h.channel(world["address"], world["ca"]))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
    # The fuzz reached verification and every kind of refusal, not only the first check.
    assert {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND"} <= set(seen), seen


def test_a_killed_client_frees_its_slot_and_others_are_unaffected(world, bob_reference):
    script = f"""
import asyncio, sys
sys.path.insert(0, {str(ROOT)!r})
from tests import grpc_helpers as h
from jaxspec.protocol import wire
from jaxspec.proto import verifier_pb2 as pb
import numpy as np
async def main():
    ep = h.endpoint({world["address"]!r}, h.TOKENS["alice"], h.pathlib.Path({str(world["ca"])!r}))
    info = await ep.open_session(h.config())
    q = np.full((1, {VOCAB}), 1 / {VOCAB})
    await ep.verify(h.jaxspec.protocol.DraftBlock(
        session_id=info.session_id, epoch=0, start=4, tokens=(1,), q=q))
    print("streaming", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""
    before = live_sessions(world)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
        assert live_sessions(world) == before + 1
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while live_sessions(world) != before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_sessions(world) == before
    finally:
        proc.kill()
    assert h.run(client(world, "bob", BOB_CFG)).tokens == bob_reference


def scrape(host: str, port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of the endpoint, parsed as Prometheus exposition: {(name, labels): v}."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(values: dict, name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def rejected(values: dict, method: str) -> dict[str, float]:
    """{status: count} of the refusals of `method` in a scrape."""
    return {
        dict(labels)["status"]: v
        for (name, labels), v in values.items()
        if name == "jaxspec_rejected_requests_total" and dict(labels)["method"] == method
    }


def test_prometheus_metrics(world):
    """One session and one refused call move the counters by exactly what they did; normal
    session ends — CloseSession while the stream is open (the edge client), or after the
    stream ended and closed the session (a client that half-closes first) — refuse nothing."""
    host, port = h.metrics_address(world["server"])
    assert host == "127.0.0.1"
    before = scrape(host, port)
    with pytest.raises(grpc.RpcError):
        stub(world).Stats(pb.StatsRequest(), metadata=h.auth(None), timeout=10)
    trace = h.run(client(world, "bob", BOB_CFG))
    s, md = stub(world), h.auth("alice")
    sid = s.OpenSession(
        wire.config_to_proto(h.config(encoding="onehot")), metadata=md, timeout=10
    ).session_id
    block = pb.VerifyRequest(block=pb.DraftBlock(session_id=sid, start=4, tokens=[1]))
    (answer,) = s.Verify(iter([block]), metadata=md, timeout=20)  # one answer, half-closed
    answer = answer.result
    s.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=md, timeout=10)
    after = scrape(host, port)

    def delta(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert rejected(after, "CloseSession") == rejected(before, "CloseSession")

    # vLLM's counters, per tenant: each equals the figures its session's results carried.
    for tenant, f in (("bob", trace.figures), ("alice", wire.result_from_proto(answer).figures)):
        assert delta("vllm:spec_decode_num_drafts_total", tenant=tenant) == f.num_drafts > 0
        assert delta("vllm:spec_decode_num_draft_tokens_total", tenant=tenant) == (
            f.num_draft_tokens
        )
        assert delta("vllm:spec_decode_num_accepted_tokens_total", tenant=tenant) == (
            f.num_accepted_tokens
        )
        for pos, n in enumerate(f.accepted_per_position):
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            assert delta(name, tenant=tenant, position=str(pos)) == n
    bob = dict(tenant="bob")
    assert trace.figures.num_draft_tokens > 0 and trace.figures.emitted == len(trace.tokens)
    assert wire.result_from_proto(answer).figures.num_draft_tokens == 1
    assert delta("jaxspec_committed_tokens_total", **bob) == len(trace.tokens) > 0
    assert delta("jaxspec_stale_blocks_total", **bob) >= trace.stale
    assert delta("jaxspec_sessions_opened_total", **bob) == 1
    refused = dict(method="Stats", status="UNAUTHENTICATED")
    assert delta("jaxspec_rejected_requests_total", **refused) == 1
    answered = delta("jaxspec_block_seconds_count", **bob)
    assert trace.figures.rounds + trace.stale <= answered <= trace.blocks_sent
    # Every verify step is observed once: the histograms count the scheduler's steps.
    steps = sample(after, "jaxspec_verify_steps_total")
    assert steps > 0
    assert sample(after, "jaxspec_verify_step_seconds_count") == steps
    assert sample(after, "jaxspec_batch_rows_count") == steps
    assert sample(after, "jaxspec_batch_rows_bucket", le="8.0") == steps  # 8 rows at most
    assert 0 < sample(after, "jaxspec_batch_occupancy") <= 1
    assert 0 <= sample(after, "jaxspec_kv_padding") < 1  # steps read some live KV
    assert sample(after, "jaxspec_serving") == 1
    assert sample(after, "jaxspec_sessions") == live_sessions(world)


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def listening(server: VerifierProcess, port: int) -> set[str]:
    """The addresses `server`'s process listens on at `port` (its own sockets only)."""
    conns = psutil.Process(server.proc.pid).net_connections(kind="tcp")
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_metrics_listen_on_loopback_unless_told_otherwise(world):
    """`--host 0.0.0.0` opens gRPC to every interface; the metrics (tenant names, no auth)
    stay on 127.0.0.1 unless `--metrics-host` moves them. On Linux 127.0.0.2 is loopback
    too, yet reaches only sockets bound to it or to the wildcard address."""
    common = ["--checkpoint", str(world["target"]), *h.SERVER_FLAGS, "--metrics-port", "0"]
    env = h.server_env(world["root"] / "jax-cache")
    wide = VerifierProcess([*common, "--host", "0.0.0.0", "--allow-insecure-public"], env=env)
    # This one runs with JAX's cache variable unset: its compiled steps go to the per-user
    # default, $XDG_CACHE_HOME/jaxspec/xla.
    xdg = world["root"] / "xdg"
    moved_env = dict(env, JAX_COMPILATION_CACHE_DIR="", XDG_CACHE_HOME=str(xdg))
    moved = VerifierProcess([*common, "--metrics-host", "127.0.0.2"], env=moved_env)
    with wide, moved:  # both start at once
        wide.wait_ready(180)
        moved.wait_ready(180)
        assert f"compilation cache: {xdg / 'jaxspec' / 'xla'}" in moved.log
        assert any((xdg / "jaxspec" / "xla").glob("*-cache")), moved.log
        assert reachable("127.0.0.2", wide.port)  # the probe sees a wildcard bind
        host, port = h.metrics_address(wide)
        assert host == "127.0.0.1" and listening(wide, port) == {"127.0.0.1"}
        assert reachable("127.0.0.1", port) and not reachable("127.0.0.2", port)
        host, port = h.metrics_address(moved)
        assert host == "127.0.0.2" and listening(moved, port) == {"127.0.0.2"}
        # (Not probed on 127.0.0.1: another process of the run may hold that port there.)
        assert reachable("127.0.0.2", port)
        assert sample(scrape(host, port), "jaxspec_serving") == 1
    assert wide.proc.returncode == moved.proc.returncode == 0


def test_unauthenticated_client_error_is_precise(world):
    async def go():
        async with h.endpoint(world["address"], "nope", world["ca"]) as ep:
            with pytest.raises(Unauthenticated):
                await ep.open_session(h.config())

    asyncio.run(go())


def test_load_generator_keeps_a_clean_ledger(world, tmp_path):
    """The closed-loop load generator (tools/load_gen.py), briefly: every token accounted for."""
    out = tmp_path / "load.json"
    cmd = [
        sys.executable, str(ROOT / "tools" / "load_gen.py"), "--verifier", world["address"],
        "--token", h.TOKENS["alice"], "--tls-ca", str(world["ca"]), "--sessions", "3",
        "--seconds", "4", "--draft", str(world["draft"]), "--quantize", "none",
        "--max-new-tokens", "16", "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    summary = json.loads(out.read_text())
    assert summary["sessions_completed"] >= 3 and summary["tokens"] > 0
    assert summary["lost_tokens"] == summary["duplicated_tokens"] == 0
    assert summary["mismatched_sessions"] == 0
    assert "round_p99_ms" in proc.stdout


def test_the_ledger_catches_lost_and_duplicated_tokens():
    """The load generator's ledger is a real check: a gap or an overlap is counted."""
    from jaxspec.protocol import VerifyResult
    from tests.tool_scripts import load_tool

    mod = load_tool("load_gen")

    led = mod.Ledger()
    led.opened("s", h.config(prompt=(1, 2)))
    led.result("s", VerifyResult(epoch=0, start=2, tokens=(5, 6)), 0.0)
    assert (led.lost, led.duplicated) == (0, 0)
    led.result("s", VerifyResult(epoch=0, start=5, tokens=(7,)), 0.0)  # position 4 skipped
    assert led.lost == 1
    led.result("s", VerifyResult(epoch=0, start=5, tokens=(7, 8)), 0.0)  # 5 again
    assert led.duplicated == 1


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ("[tenants.x]\nmax_sessions = 2\n", "needs exactly one of token / token_sha256"),
        ('[tenants.x]\ntoken = "a"\n[tenants.y]\ntoken = "a"\n', "two tenants share a token"),
        ("not toml [", "cannot read tenants file"),
    ],
)
def test_serve_refuses_a_bad_tenants_file(tmp_path, tenants, message):
    path = tmp_path / "tenants.toml"
    path.write_text(tenants)
    cmd = [sys.executable, "-m", "verify", "serve", "--pair", "tiny", "--port", "0", "--tenants"]
    cmd.append(str(path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
