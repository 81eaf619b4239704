"""q from the edge's device to the verifier's step, once per block (docs/design.md §4):

- `DraftBlock` checks q's values as it is made (each bad q refused, the good ones kept as
  read-only float32) and is the only place they are checked: a block through the wire and
  the scheduler's submit is checked once, at the decode;
- float32 q travels as packed bytes (`q_f32`) bit for bit, and an old client's `repeated
  float q` still decodes to the same block; a block with two forms of q is refused;
- the edge makes a block with one explicit device-to-host transfer and keeps q float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxspec
import jaxspec.protocol.blocks as protocol  # where a block checks its q
from edge.drafter import DraftBatch
from edge.session import _to_wire
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.decoding.verification import DraftQ
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.protocol import DraftBlock, DraftSpec, InvalidArgument, SessionConfig, wire
from verify import Scheduler, SchedulerConfig

V = tiny_config().vocab_size


def _q(n: int = 2, m: int = V) -> np.ndarray:
    rng = np.random.default_rng(n * 1000 + m)
    q = rng.random((n, m)).astype(np.float32) + 0.01
    return (q / q.sum(axis=1, keepdims=True)).astype(np.float32)


def _block(**kw) -> DraftBlock:
    return DraftBlock(**{**dict(session_id="s", epoch=0, start=4, tokens=(5, 6), q=_q()), **kw})


def _f16(n: int = 2, m: int = V) -> dict:
    """The fields of a float16 block: q16 and the edge's scale (1 / the float32 sum)."""
    q16 = _q(n, m).astype(np.float16)
    scale = (np.float32(1) / q16.astype(np.float32).sum(axis=1)).astype(np.float32)
    return dict(q16=q16, q_scale=scale)


# ---- the block checks q as it is made -------------------------------------------------------

BAD = {
    "NaN": dict(q=np.where(np.arange(V) == 3, np.nan, _q())),
    "infinite": dict(q=np.where(np.arange(V) == 3, np.inf, _q())),
    "negative": dict(q=_q() - np.where(np.arange(V) == 3, 0.5, 0)),
    "not normalized": dict(q=_q() * 1.01),
    "q(d) = 0": dict(q=np.where(np.arange(V) == 5, 0, np.full((2, V), 1 / (V - 1)))),
    "a draft outside q": dict(tokens=(5, V)),
    "rows != drafts": dict(q=_q(3)),
    "not 2-D": dict(q=_q().ravel()),
    "not numbers": dict(q=[["a"] * V] * 2),
    "numbers as strings": dict(q=_q().astype(str)),
    "not numbers, float16 form": dict(q=[["a"] * V] * 2, q_scale=_f16()["q_scale"]),
    "q without drafts": dict(tokens=()),
    "ids without q": dict(q=None, q_ids=np.zeros((2, 4), np.int64)),
    "ids of another shape": dict(q=_q(2, 4), q_ids=np.zeros((2, 3), np.int64)),
    "float ids": dict(q=_q(2, 4), q_ids=np.zeros((2, 4))),
    "sparse q(d) = 0": dict(q=_q(2, 4), q_ids=np.zeros((2, 4), np.int64)),
    "q16 without q_scale": dict(q=None, q16=_f16()["q16"]),
    "scale without q": dict(q=None, q_scale=_f16()["q_scale"]),
    "q not q16 * scale": dict(q=_q(), **_f16()),
    "q16 NaN": dict(q=None, **{**_f16(), "q16": np.full((2, V), np.nan, np.float16)}),
    "scale <= 0": dict(q=None, **{**_f16(), "q_scale": np.zeros(2, np.float32)}),
    "tokens not ids": dict(tokens=((1, 2), (3, 4))),
}


@pytest.mark.parametrize("what", list(BAD))
def test_a_bad_q_is_refused_as_the_block_is_made(what):
    _block()  # the unspoiled block is made
    with pytest.raises(InvalidArgument):
        _block(**BAD[what])


def test_a_made_block_holds_read_only_float32():
    wide = _q().astype(np.float64)  # rounded to float32 as it is made, as the verifier reads it
    block = _block(q=wide, tokens=np.array([5, 6]))
    assert block.q.dtype == np.float32 and not block.q.flags.writeable
    np.testing.assert_array_equal(block.q, wide.astype(np.float32))
    assert block.tokens == (5, 6) and all(type(t) is int for t in block.tokens)
    with pytest.raises(ValueError):
        block.q[0, 0] = 1.0  # checked once: it cannot change after
    f16 = _block(q=None, **_f16())
    assert f16.q.dtype == np.float32 and f16.q16.dtype == np.float16
    again = _block(q=f16.q, q_scale=f16.q_scale)  # q given: q16 derived, the same values
    np.testing.assert_array_equal(again.q16.view(np.uint16), f16.q16.view(np.uint16))
    assert _block(q=None, q_ids=None).q is None  # no q: a one-hot block


# ---- q_f32 on the wire ----------------------------------------------------------------------


def _through(block: DraftBlock) -> tuple[pb.DraftBlock, DraftBlock]:
    m = pb.DraftBlock.FromString(wire.block_to_proto(block).SerializeToString())
    return m, wire.block_from_proto(m)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4), spread=st.sampled_from([0.5, 8.0]))
def test_float32_q_travels_as_packed_bytes_bit_for_bit(seed, n, spread):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, V)) * spread
    q = np.exp(logits - logits.max(axis=1, keepdims=True)).astype(np.float32)
    q = (q / q.sum(axis=1, keepdims=True)).astype(np.float32)  # tiny values and subnormals too
    block = _block(q=q, tokens=tuple(q.argmax(axis=1).tolist()))
    m, got = _through(block)
    assert len(m.q_f32) == 4 * n * V and not len(m.q) and not m.q_f16
    np.testing.assert_array_equal(got.q.view(np.uint32), q.view(np.uint32))
    old = pb.DraftBlock(session_id="s", start=4, tokens=block.tokens, q=q.ravel())  # old client
    np.testing.assert_array_equal(wire.block_from_proto(old).q.view(np.uint32), q.view(np.uint32))


def test_sparse_and_onehot_blocks_round_trip():
    ids = np.array([[5, 1, 2, 3], [6, 0, 9, 8]])
    _, got = _through(_block(q=_q(2, 4), q_ids=ids))
    np.testing.assert_array_equal(got.q_ids, ids)
    np.testing.assert_array_equal(got.q, _q(2, 4))
    m, got = _through(_block(q=None))
    assert got.q is None and not m.q_f32 and not len(m.q)


MALFORMED = {
    "odd byte count": lambda m: setattr(m, "q_f32", m.q_f32[:-1]),
    "not n equal rows": lambda m: setattr(m, "q_f32", m.q_f32[:-4]),
    "q as well": lambda m: m.q.extend([1.0 / V] * (2 * V)),
    "q_f16 as well": lambda m: setattr(m, "q_f16", np.full(2 * V, 1 / V, "<f2").tobytes()),
    "q_scale as well": lambda m: m.q_scale.extend([1.0, 1.0]),
    "values that are not a distribution": lambda m: setattr(m, "q_f32", bytes(len(m.q_f32))),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_malformed_float32_payloads_are_invalid_argument(what):
    m = wire.block_to_proto(_block())
    wire.block_from_proto(m)  # the unspoiled message decodes
    MALFORMED[what](m)
    with pytest.raises(InvalidArgument):
        wire.block_from_proto(pb.DraftBlock.FromString(m.SerializeToString()))


# ---- one check per block --------------------------------------------------------------------


def test_a_block_is_checked_once_from_the_wire_to_the_queue(monkeypatch):
    """The decode checks q (through `DraftBlock`); the scheduler's submit does not again. The
    count and the spoiled q would catch a check added back on the submit path (the count, one
    lost at the decode)."""
    cfg = tiny_config()
    model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
    sched = Scheduler(model, SchedulerConfig(max_gamma=4, max_sessions=2, max_len=96))
    calls = []
    for name in ("check_q", "q_to_f16", "q_from_f16"):
        real = getattr(protocol, name)
        monkeypatch.setattr(protocol, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    for q_dtype, form in (("float32", dict(q=_q())), ("float16", dict(q=None, **_f16()))):
        spec = DraftSpec(gamma=4, q_dtype=q_dtype)
        sid = sched.open(SessionConfig(prompt=(1, 2, 3, 4), draft=spec)).session_id
        m = wire.block_to_proto(_block(session_id=sid, **form))
        calls.clear()
        block = wire.block_from_proto(pb.DraftBlock.FromString(m.SerializeToString()))
        assert calls.count("check_q") == 1 and "q_to_f16" not in calls, (q_dtype, calls)
        calls.clear()
        sched.submit(block)
        assert calls == [], (q_dtype, calls)
        # Nor does it read the values in any other way: a q spoiled after the block was made
        # (which no caller can do: its arrays are read-only) is queued all the same.
        spoiled = dataclasses.replace(block)
        object.__setattr__(spoiled, "q", np.full_like(block.q, np.nan))
        sched.submit(spoiled)
        with pytest.raises(InvalidArgument):  # and the session's own rules still hold
            five = dict(tokens=(5, 6, 7, 8, 9), q=_q(5), q16=None, q_scale=None)
            sched.submit(dataclasses.replace(block, **five))  # 5 drafts, gamma 4


# ---- the edge: one transfer, float32 --------------------------------------------------------


@pytest.mark.parametrize("encoding", ["full", "sparse", "onehot", "full-f16"])
def test_the_edge_makes_a_block_with_one_explicit_transfer(encoding, monkeypatch):
    """Under a transfer guard that refuses implicit device-to-host copies, `_to_wire` makes
    the block with one `jax.device_get`; q stays float32, the values the batch holds."""
    q, ids, scale = _q(4), None, None
    if encoding == "sparse":
        q, ids = _q(4, 3), np.array([[5, 1, 2], [6, 1, 2], [7, 1, 2], [8, 1, 2]])
    if encoding == "full-f16":
        f16 = _f16(4)
        scale, q = f16["q_scale"], protocol.q_from_f16(f16["q16"], f16["q_scale"])
    dq = {
        "full": lambda: DraftQ.full(q[None]),
        "full-f16": lambda: DraftQ.full(q[None], jnp.asarray(scale[None])),
        "sparse": lambda: DraftQ.sparse(ids[None], q[None]),
        "onehot": DraftQ.onehot,
    }[encoding]()
    tokens = jnp.asarray([[5, 6, 7, 8]], jnp.int32)
    batch = DraftBatch(start=jnp.asarray([4], jnp.int32), tokens=tokens, q=dq)
    gets = []
    real_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: gets.append(1) or real_get(x))
    with jax.transfer_guard_device_to_host("disallow"):
        block = _to_wire(batch, "s", 0)
    assert len(gets) == 1 and block.tokens == (5, 6, 7, 8) and block.start == 4
    if encoding == "onehot":
        assert block.q is None and block.q_ids is None
        return
    assert block.q.dtype == np.float32
    np.testing.assert_array_equal(block.q.view(np.uint32), q.view(np.uint32))
    if encoding == "full-f16":
        np.testing.assert_array_equal(block.q_scale, scale)
        np.testing.assert_array_equal(block.q16.view(np.uint16), f16["q16"].view(np.uint16))
