"""Hostile input against a real verifier (a `python -m verify serve` subprocess, TLS, the
tenants of tests/grpc_helpers.py): every failure ends with a documented status, never UNKNOWN,
never a traceback in the server's log, never a hung stream, and a well-behaved tenant's
session running meanwhile keeps exactly its tokens (docs/service.md, "Bad input")."""

from __future__ import annotations

import threading

import grpc
import pytest

from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import DraftBlock, wire
from tests import grpc_helpers as h

BOB_CFG = h.BOB_CFG
ALICE_CFG = h.config(prompt=(1, 2, 3), max_new_tokens=32, mode="sync", gamma=2, seed=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    target, draft, cert, server = h.spawn_tls_tenants(root)
    world = dict(target=target, draft=draft, ca=cert, server=server)
    world["address"] = f"localhost:{server.port}"
    world["bob"] = bob_tokens(world)  # the well-behaved tenant's reference
    try:
        yield world
    finally:
        log = server.log
        assert server.stop() == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def bob_tokens(world) -> tuple[int, ...]:
    cfg = BOB_CFG
    return h.run(
        h.session(world["address"], world["draft"], cfg, h.TOKENS["bob"], world["ca"])
    ).tokens


class Bob:
    """Bob's session in a thread while the hostile calls run; `check` joins it and asserts
    its tokens are the reference's."""

    def __init__(self, world):
        self.world, self.tokens = world, None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        self.tokens = bob_tokens(self.world)

    def check(self):
        self.thread.join(120)
        assert self.tokens == self.world["bob"]


def channel(world) -> grpc.Channel:
    return h.channel(world["address"], world["ca"])


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    return e.value.code(), e.value.details()


def open_session(world, tenant="alice", cfg=ALICE_CFG) -> str:
    stub = pb_grpc.VerifierStub(channel(world))
    return stub.OpenSession(wire.config_to_proto(cfg), metadata=h.auth(tenant)).session_id


@pytest.mark.parametrize("method", ["OpenSession", "CloseSession", "Stats"])
def test_undecodable_unary_requests_are_invalid_argument(world, method):
    bob = Bob(world)
    raw = channel(world).unary_unary(
        f"/jaxspec.v1.Verifier/{method}", request_serializer=None, response_deserializer=None
    )
    code, details = code_of(lambda: raw(b"\xff\xff\xff", metadata=h.auth("alice"), timeout=20))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    # an unknown caller learns nothing more than UNAUTHENTICATED
    code, _ = code_of(lambda: raw(b"\xff\xff\xff", timeout=20))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    bob.check()


@pytest.mark.parametrize("top_k", [2**31, 2**32 - 1])
def test_a_top_k_past_int32_is_invalid_argument(world, top_k):
    bob = Bob(world)
    req = wire.config_to_proto(ALICE_CFG)
    req.top_k = top_k
    stub = pb_grpc.VerifierStub(channel(world))
    code, details = code_of(lambda: stub.OpenSession(req, metadata=h.auth("alice"), timeout=20))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "top_k" in details
    bob.check()


ONEHOT_CFG = h.config(
    prompt=(1, 2, 3), max_new_tokens=32, mode="pipelined", gamma=2, encoding="onehot", seed=3
)


def open_onehot(world) -> str:
    return open_session(world, cfg=ONEHOT_CFG)


def block(sid: str, epoch: int, start: int, tokens=(10, 20)) -> bytes:
    b = wire.block_to_proto(DraftBlock(session_id=sid, epoch=epoch, start=start, tokens=tokens))
    return pb.VerifyRequest(block=b).SerializeToString()


def raw_verify(world, messages, timeout=20):
    """A raw Verify stream of `messages` (bytes): (the results, the status code, details)."""
    call = channel(world).stream_stream(
        "/jaxspec.v1.Verifier/Verify", request_serializer=None, response_deserializer=None
    )
    results = []
    try:
        for r in call(iter(messages), metadata=h.auth("alice"), timeout=timeout):
            results.append(wire.result_from_proto(pb.VerifyResponse.FromString(r).result))
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e.details()
        return results, e.code(), e.details()
    return results, grpc.StatusCode.OK, ""


def next_block(sid: str, r) -> bytes:
    epoch = r.new_epoch or r.epoch
    return block(sid, epoch, r.start + len(r.tokens))


def test_an_undecodable_verify_message_ends_the_stream_and_frees_the_session(world):
    bob = Bob(world)
    sid = open_onehot(world)
    start = len(ONEHOT_CFG.prompt)
    results, code, details = raw_verify(world, [block(sid, 0, start), b"\xff\xff\xff"])
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert len(results) == 1 and not results[0].stale
    # the session is not bound to a hung stream: a new stream goes on with it
    more, code, details = raw_verify(world, [next_block(sid, results[0])])
    assert code == grpc.StatusCode.OK, details
    assert len(more) == 1 and not more[0].stale
    # undecodable from the first message on
    _, code, details = raw_verify(world, [b"\xff\xff\xff"])
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    bob.check()


VOCAB = 258  # the byte tokenizer of jaxspec.ckpts.tiny


def open_code(world, **fields) -> tuple[grpc.StatusCode, str]:
    """OpenSession with `fields` set on Alice's request: its status (closing what opened)."""
    req = wire.config_to_proto(ALICE_CFG)
    for name, value in fields.items():
        if isinstance(value, list):
            del getattr(req, name)[:]
            getattr(req, name).extend(value)
        elif isinstance(value, dict):  # a proto map
            getattr(req, name).clear()
            getattr(req, name).update(value)
        else:
            setattr(req, name, value)
    stub = pb_grpc.VerifierStub(channel(world))
    try:
        sid = stub.OpenSession(req, metadata=h.auth("alice"), timeout=20).session_id
    except grpc.RpcError as e:
        return e.code(), e.details()
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=h.auth("alice"))
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize(
    "fields",
    [
        dict(top_p=float("nan")),
        dict(top_p=-0.5),
        dict(top_p=1.5),
        dict(top_p=float("inf")),
        dict(stop_tokens=[VOCAB], default_stop_tokens=False),
        dict(stop_tokens=[-1], default_stop_tokens=False),
        dict(stop_tokens=list(range(100, 165)), default_stop_tokens=False),  # 65 > 64
        dict(min_p=float("nan")),
        dict(min_p=1.5),
        dict(logit_bias={VOCAB: 1.0}),
        dict(logit_bias={-2: 1.0}),
        dict(logit_bias={3: 100.5}),
        dict(logit_bias={3: float("nan")}),
        dict(logit_bias=dict.fromkeys(range(33), 1.0)),  # 33 > 32
        dict(repetition_penalty=0.0),  # set, so not "unset": refused
        dict(repetition_penalty=-1.0),
        dict(repetition_penalty=float("nan")),
        dict(repetition_penalty=float("inf")),
        dict(presence_penalty=2.5),
        dict(frequency_penalty=float("-inf")),
    ],
    ids=[
        "top_p-nan",
        "top_p-negative",
        "top_p-above-1",
        "top_p-inf",
        "stop-vocab",
        "stop-neg",
        "stop-65",
        "min_p-nan",
        "min_p-above-1",
        "bias-vocab",
        "bias-neg-id",
        "bias-above-100",
        "bias-nan",
        "bias-33",
        "rep-0",
        "rep-negative",
        "rep-nan",
        "rep-inf",
        "presence-above-2",
        "frequency-inf",
    ],
)
def test_bad_sampling_and_stop_tokens_are_invalid_argument(world, fields):
    bob = Bob(world)
    code, details = open_code(world, **fields)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    bob.check()


@pytest.mark.parametrize(
    "fields",
    [
        dict(top_p=0.0),  # proto3's unset: off
        dict(top_p=1.0),
        dict(top_p=0.5),
        dict(stop_tokens=list(range(100, 164)), default_stop_tokens=False),  # 64
        dict(stop_tokens=[VOCAB - 1], default_stop_tokens=False),
        dict(min_p=1.0, logit_bias={VOCAB - 1: -100.0, 0: 100.0}),
        dict(logit_bias=dict.fromkeys(range(32), 1.0)),  # 32
        dict(repetition_penalty=1.3, presence_penalty=2.0, frequency_penalty=-2.0),
    ],
    ids=[
        "top_p-0-unset",
        "top_p-1",
        "top_p-half",
        "stop-64",
        "stop-last-id",
        "min_p-bias",
        "bias-32",
        "penalties-bounds",
    ],
)
def test_the_bounds_themselves_are_accepted(world, fields):
    code, details = open_code(world, **fields)
    assert code == grpc.StatusCode.OK, details


START = len(ONEHOT_CFG.prompt)


def two_blocks(world, sid: str, between) -> list:
    """A Verify stream of two blocks (the second after the first's result), calling `between`
    in between while the stream is live: the results."""
    got, first = [], threading.Event()

    def messages():
        yield block(sid, 0, START)
        assert first.wait(120)  # a first block on a --no-warmup server waits for its compile
        between()
        yield next_block(sid, got[0])

    call = channel(world).stream_stream(
        "/jaxspec.v1.Verifier/Verify", request_serializer=None, response_deserializer=None
    )
    for r in call(messages(), metadata=h.auth("alice"), timeout=30):
        got.append(wire.result_from_proto(pb.VerifyResponse.FromString(r).result))
        first.set()
    return got


def test_a_second_stream_on_a_session_is_refused_and_the_first_goes_on(world):
    bob = Bob(world)
    reference = two_blocks(world, open_onehot(world), lambda: None)
    sid = open_onehot(world)
    second = []

    def intrude():
        _, code, details = raw_verify(world, [block(sid, 0, START)])
        second.append((code, details))

    got = two_blocks(world, sid, intrude)
    assert second[0][0] == grpc.StatusCode.FAILED_PRECONDITION, second
    assert "already has a stream" in second[0][1]
    assert got == reference and len(got) == 2 and not any(r.stale for r in got)
    bob.check()


GREEDY_CFG = h.config(
    prompt=(1, 2, 3), max_new_tokens=32, mode="pipelined", gamma=2, encoding="onehot",
    temperature=0.0, seed=3,
)  # fmt: skip


def test_no_block_read_after_a_failing_one_is_committed(world):
    bob = Bob(world)

    def first(tokens) -> object:  # the result of one block at START on a fresh session
        sid = open_session(world, cfg=GREEDY_CFG)
        results, code, details = raw_verify(world, [block(sid, 0, START, tokens)])
        assert code == grpc.StatusCode.OK, details
        return results[0]

    g1 = first((10, 20)).tokens[0]  # greedy: the target's own first two tokens
    g2 = first((g1, 20)).tokens[1]
    r1 = first((g1, g2))  # all accepted: a block after it, at epoch 0, is not stale
    after = r1.start + len(r1.tokens)
    for _ in range(5):  # one write burst: a valid block, a failing one, a valid one
        sid = open_session(world, cfg=GREEDY_CFG)
        burst = [block(sid, 0, START, (g1, g2)), block(sid, 0, START, (1, 2, 3))]
        results, code, details = raw_verify(world, [*burst, block(sid, 0, after, (10,))])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert results == [r1]
        # the client was told of r1 only: the session's committed length is r1's end
        check, code, details = raw_verify(world, [block(sid, 0, after, (10,))])
        assert code == grpc.StatusCode.OK, details
        assert len(check) == 1 and not check[0].stale, check
    bob.check()
