"""q in float16 on the wire (`DraftSpec.q_dtype`, docs/design.md §3-§4): half the bytes of q,
and the rule still exact, because the draft is sampled from the very q the verifier rebuilds.

- the law each draft is drawn with, measured (bisection on the uniform), is the q the wire
  carries; the mutant `f16_sampled_unrounded` (drafted from the unrounded q) is caught;
- the proto round trip gives bit-identical float32 q (a property over float16 values);
- an edge session of q_dtype float16 over the protobuf bytes gives exactly the tokens of
  co-located decoding with the same q dtype;
- malformed float16 payloads, and forms that are not the session's, are INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jaxspec
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.decoding.speculative import draft_q_for
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.protocol import (
    DraftBlock,
    DraftSpec,
    InvalidArgument,
    SamplingSettings,
    SessionConfig,
    q_from_f16,
    q_to_f16,
    wire,
)
from tests.fixtures import peaked_models, peaked_scheduler
from tests.mutants import replacement
from verify import LocalVerifier

V, K = 64, 8  # tiny_config's vocabulary; sparse columns
PROMPT, NEW = (1, 2, 3, 4), 16


pytestmark = pytest.mark.usefixtures("x64")  # float64: exact decisions


@functools.cache
def draft_fn(mutant: str | None = None):
    """`draft_q_for` (or the wrong one of `mutant`, `tests/mutants.py`), jitted once for every
    test here (static: encoding, k, dtype)."""
    fn = draft_q_for if mutant is None else replacement(mutant)
    return jax.jit(fn, static_argnames=("encoding", "sparse_k", "q_dtype"))


def _draft(logits, u, encoding, mutant=None, q_dtype="float16", temperature=1.0):
    rows = logits.shape[0]
    sampling = SamplingParams.make(rows, temperature)
    return draft_fn(mutant)(
        jnp.asarray(logits, jnp.float32), sampling, jnp.asarray(u, jnp.float32),
        encoding=encoding, sparse_k=K, q_dtype=q_dtype,
    )  # fmt: skip


def _over_the_wire(block: DraftBlock) -> DraftBlock:
    """What the verifier decodes from the bytes the edge's client sends for `block`."""
    raw = wire.block_to_proto(block).SerializeToString()
    return wire.block_from_proto(pb.DraftBlock.FromString(raw))


def _block(d, q, encoding, q_dtype, row=0) -> DraftBlock:
    """Row `row` of a `draft_q_for` result as a one-draft block."""
    scale = None
    if q_dtype == "float16":
        *q, scale = q
        scale = np.asarray(scale[row : row + 1])
    ids = None
    if encoding == "sparse":
        ids, probs = q
        ids = np.asarray(ids[row : row + 1])
    else:
        (probs,) = q if isinstance(q, list) else (q,)
    return DraftBlock(
        session_id="s", epoch=0, start=len(PROMPT), tokens=(int(d[row]),),
        q=np.asarray(probs[row : row + 1]), q_ids=ids, q_scale=scale,
    )  # fmt: skip


# ---- the draft is drawn from the q on the wire ----------------------------------------------


def measured_law(logits_V, encoding, mutant, q_dtype) -> np.ndarray:
    """The law the draft is really drawn with, over q's outcomes (tokens for full, top-k
    columns for sparse): inverse-CDF sampling is monotone in u, so outcome j takes the u in
    [b_j, b_{j+1}); each boundary is the smallest float32 u that draws an outcome >= j, found
    by bisection on the bit patterns of the floats in [0, 1), all boundaries at once."""
    m = V if encoding == "full" else K
    rows = m - 1
    logits = np.broadcast_to(logits_V, (rows, V))
    order = None
    if encoding == "sparse":
        _, q = _draft(logits[:1], [0.5], encoding, None, q_dtype)
        order = {int(t): i for i, t in enumerate(np.asarray(q[0][0]))}

    def outcome(bits):
        u = np.asarray(bits, np.uint32).view(np.float32)
        d = np.asarray(_draft(logits, u, encoding, mutant, q_dtype)[0])
        return d if order is None else np.array([order[int(t)] for t in d])

    lo = np.zeros(rows, np.int64)
    hi = np.full(rows, np.float32(1.0).view(np.uint32), np.int64)
    want = np.arange(1, m)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        up = outcome(mid) >= want
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid + 1)
    bounds = lo.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.diff(np.concatenate([[0.0], bounds, [1.0]]))


def _peaky_logits() -> np.ndarray:
    return (np.random.default_rng(11).normal(size=V) * 2.5).astype(np.float32)


@pytest.mark.parametrize("encoding", ["full", "sparse"])
@pytest.mark.parametrize(
    ("q_dtype", "mutant"),
    [("float32", None), ("float16", None), ("float16", "f16_sampled_unrounded")],
)
def test_the_draft_is_drawn_from_the_q_on_the_wire(encoding, q_dtype, mutant):
    """The exactness check: the measured law of the draft equals the q the verifier decodes
    (up to the sampler's float32 cumulative sum, ~1e-7), for float32 and float16 q alike; the
    mutant that drafts from the unrounded q but sends the float16 one is off by the float16
    rounding (~1e-4) and is caught."""
    logits = _peaky_logits()
    d, q = _draft(logits[None], [0.5], encoding, mutant, q_dtype)
    sent = _over_the_wire(_block(d, q, encoding, q_dtype)).q[0].astype(np.float64)
    expected = sent / sent.sum()  # sample() scales u by q's total
    gap = np.max(np.abs(measured_law(logits, encoding, mutant, q_dtype) - expected))
    if mutant is None:
        assert gap < 1e-6
    else:
        # The rounding is big enough here to show; the check then sees it.
        unrounded = _draft(logits[None], [0.5], encoding, None, "float32")[1]
        unrounded = np.asarray(unrounded[1] if encoding == "sparse" else unrounded)[0]
        assert np.max(np.abs(unrounded - sent)) > 2e-5
        assert gap > 1e-5, "the mutant f16_sampled_unrounded was NOT caught"


# ---- the round trip is bit for bit ----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    bits=hnp.arrays(
        np.uint16,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40),
        elements=st.integers(0, 0x7BFF),  # every finite float16 >= 0: zeros, subnormals, max
    ),
    scale=st.floats(0.25, 4.0, width=32),
)
def test_float16_q_round_trips_bit_for_bit(bits, scale):
    q16 = bits.view(np.float16)
    n, m = q16.shape
    scales = np.full(n, scale, np.float32) * np.linspace(1, 1.5, n, dtype=np.float32)
    q = q_from_f16(q16, scales)
    assert q.dtype == np.float32
    np.testing.assert_array_equal(q_to_f16(q, scales).view(np.uint16), bits)
    # As a block, each row a distribution: scaled by 1 / its float32 sum, as the edge does.
    values = q16.astype(np.float32)
    assume(np.all(values.max(axis=1) > 0))
    norm = (np.float32(1) / values.sum(axis=1)).astype(np.float32)
    q = q_from_f16(q16, norm)
    tokens = tuple(values.argmax(axis=1).tolist())
    made = dict(session_id="s", epoch=1, start=9, tokens=tokens, q_scale=norm)
    for block in (DraftBlock(q=q, **made), DraftBlock(q16=q16, **made)):  # either form given
        m_pb = wire.block_to_proto(block)
        assert not len(m_pb.q) and not m_pb.q_f32
        assert len(m_pb.q_f16) == 2 * n * m and len(m_pb.q_scale) == n
        got = wire.block_from_proto(pb.DraftBlock.FromString(m_pb.SerializeToString()))
        np.testing.assert_array_equal(got.q.view(np.uint32), q.view(np.uint32))
        np.testing.assert_array_equal(got.q16.view(np.uint16), bits)
        np.testing.assert_array_equal(got.q_scale.view(np.uint32), norm.view(np.uint32))


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    spread=st.sampled_from([0.1, 1.0, 4.0, 12.0]),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
    encoding=st.sampled_from(["full", "sparse"]),
)
def test_drafted_float16_q_round_trips_and_halves_the_bytes(seed, spread, temperature, encoding):
    """What the drafter really produces (tiny probabilities, float16 subnormals and zeros
    included) decodes to the same float32 bits, in about half the bytes of float32 q."""
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(4, V)) * spread).astype(np.float32)
    d, q = _draft(logits, rng.uniform(size=4), encoding, temperature=temperature)
    for row in range(4):
        block = _block(d, q, encoding, "float16", row)
        got = _over_the_wire(block)
        np.testing.assert_array_equal(got.q.view(np.uint32), block.q.view(np.uint32))
        if encoding == "sparse":
            np.testing.assert_array_equal(got.q_ids, block.q_ids)
        f32 = wire.block_to_proto(dataclasses.replace(block, q_scale=None, q16=None)).ByteSize()
        assert wire.block_to_proto(block).ByteSize() < 0.6 * f32 + 16


# ---- a float16 session over the protobuf bytes == co-located decoding ----------------------


class WireEndpoint:
    """A `LocalVerifier` behind the protobuf bytes both ways (what the gRPC client and server
    exchange, without the sockets); counts the float16 and float32 q that went up."""

    def __init__(self, inner):
        self.inner = inner
        self.f16_bytes = self.f32_bytes = 0

    async def open_session(self, config):
        raw = wire.config_to_proto(config).SerializeToString()
        return await self.inner.open_session(
            wire.config_from_proto(pb.OpenSessionRequest.FromString(raw))
        )

    async def verify(self, block):
        m = pb.DraftBlock.FromString(wire.block_to_proto(block).SerializeToString())
        self.f16_bytes += len(m.q_f16)
        self.f32_bytes += 4 * len(m.q) + len(m.q_f32)
        r = await self.inner.verify(wire.block_from_proto(m))
        raw = wire.result_to_proto(r).SerializeToString()
        return wire.result_from_proto(pb.VerifyResult.FromString(raw))

    async def close_session(self, session_id):
        await self.inner.close_session(session_id)


models = peaked_models  # the float64 target and draft, random but peaked


@functools.cache
def scheduler():
    return peaked_scheduler()


@pytest.mark.parametrize(
    ("mode", "encoding", "temperature"), [("sync", "full", 1.0), ("pipelined", "sparse", 0.8)]
)
def test_a_float16_session_equals_colocated_decoding(mode, encoding, temperature):
    t, d = models()
    spec = DraftSpec(gamma=3, encoding=encoding, sparse_k=4, q_dtype="float16")
    cfg = SessionConfig(
        prompt=PROMPT, max_new_tokens=NEW, mode=mode, seed=3, draft=spec,
        sampling=SamplingSettings(temperature=temperature),
    )  # fmt: skip

    async def go():
        v = LocalVerifier(scheduler=scheduler())
        ep = WireEndpoint(v)
        try:
            return await run_session(ep, Drafter(d, spec), cfg, depth=2), ep
        finally:
            await v.aclose()

    trace, ep = asyncio.run(go())
    ref = jaxspec.generate(
        t, list(PROMPT), NEW, draft=d, gamma=3, mode=mode, encoding=encoding, sparse_k=4,
        q_dtype="float16", temperature=temperature, seeds=[3],
    )  # fmt: skip
    assert trace.tokens == ref.tokens and len(trace.tokens) == NEW
    assert trace.figures.rounds > 0 and 0 < trace.figures.acceptance_rate < 1
    assert ep.f16_bytes > 0 and ep.f32_bytes == 0  # q went up as float16 only


# ---- bad float16 payloads are INVALID_ARGUMENT ----------------------------------------------


def _valid(n: int = 2, m: int = V, scale: float = 1.0) -> pb.DraftBlock:
    """A well-formed float16 block: n uniform rows (1/m is a float16) with scale 1."""
    q = q_from_f16(np.full((n, m), 1 / m, np.float16), np.full(n, scale, np.float32))
    block = DraftBlock(
        session_id="s", epoch=0, start=len(PROMPT), tokens=tuple(range(n)), q=q,
        q_scale=np.full(n, scale, np.float32),
    )  # fmt: skip
    return wire.block_to_proto(block)


def _set_half(m: pb.DraftBlock, bits: int) -> None:
    raw = bytearray(m.q_f16)
    raw[0:2] = np.uint16(bits).astype("<u2").tobytes()
    m.q_f16 = bytes(raw)


BAD = {
    "odd byte count": lambda m: setattr(m, "q_f16", m.q_f16[:-1]),
    "not n equal rows": lambda m: setattr(m, "q_f16", m.q_f16[:-2]),
    "a scale missing": lambda m: m.q_scale.__delitem__(-1),
    "a scale too many": lambda m: m.q_scale.append(1.0),
    "NaN scale": lambda m: m.q_scale.__setitem__(0, float("nan")),
    "infinite scale": lambda m: m.q_scale.__setitem__(0, float("inf")),
    "zero scale": lambda m: m.q_scale.__setitem__(0, 0.0),
    "negative scale": lambda m: m.q_scale.__setitem__(1, -1.0),
    "NaN value": lambda m: _set_half(m, 0x7E00),
    "infinite value": lambda m: _set_half(m, 0x7C00),
    "negative value": lambda m: _set_half(m, 0xBC00),
    "q as well": lambda m: m.q.extend([1.0 / V] * (2 * V)),
    "q_f32 as well": lambda m: setattr(m, "q_f32", np.full(2 * V, 1 / V, "<f4").tobytes()),
    "values without scales": lambda m: m.ClearField("q_scale"),
    "scales without values": lambda m: m.ClearField("q_f16"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_malformed_float16_payloads_are_invalid_argument(what):
    wire.block_from_proto(_valid())  # the unbroken message decodes
    m = _valid()
    BAD[what](m)
    with pytest.raises(InvalidArgument):
        wire.block_from_proto(pb.DraftBlock.FromString(m.SerializeToString()))


def test_forms_that_are_not_the_sessions_are_invalid_argument():
    """Each session is held to its q dtype, and a float16 q to being one exactly (in-process
    blocks too): a q that is not float16 values times its scale, or does not sum to 1, is
    refused as the block is made; wrong widths, a float32 q in a float16 session and a
    float16 q in a float32 session by the scheduler."""
    sched = scheduler()
    spec = DraftSpec(gamma=3, encoding="full", q_dtype="float16")
    f16 = sched.open(SessionConfig(prompt=PROMPT, draft=spec)).session_id
    f32 = sched.open(SessionConfig(prompt=PROMPT, draft=DraftSpec(gamma=3))).session_id
    try:

        def submit(sid, m: pb.DraftBlock | DraftBlock):
            block = m if isinstance(m, DraftBlock) else wire.block_from_proto(m)
            return sched.submit(dataclasses.replace(block, session_id=sid))

        good = wire.block_from_proto(_valid())
        f32_q = dict(q_scale=None, q16=None)
        other_scale = np.full(2, 1.0001, np.float32)
        bad = [  # each made inside the check: the block itself may refuse to be made
            (f16, lambda: _valid(m=V // 2)),  # decodes (2 rows of 32) but is not [n, vocab]
            (f16, lambda: dataclasses.replace(good, **f32_q)),  # float32 q, float16 session
            (f16, lambda: dataclasses.replace(good, q16=None, q_scale=other_scale)),
            (f16, lambda: dataclasses.replace(good, q_scale=other_scale)),  # q16 disagrees
            (f16, lambda: _valid(scale=2.0)),  # exact float16 form, but q sums to 2
            (f32, lambda: good),  # a float16 q in a float32 session
        ]
        for sid, make in bad:
            with pytest.raises(InvalidArgument):
                submit(sid, make())
        assert submit(f16, good) > 0  # and the well-formed one is taken
        assert submit(f32, dataclasses.replace(good, **f32_q)) > 0
    finally:
        sched.close(f16)
        sched.close(f32)


def test_the_q_dtype_is_validated_and_travels_with_the_session():
    with pytest.raises(InvalidArgument, match="q_dtype"):
        DraftSpec(q_dtype="bfloat16")
    assert not DraftSpec(encoding="onehot", q_dtype="float16").f16  # accepted, no q to send
    for spec in (
        DraftSpec(q_dtype="float16"),
        DraftSpec(encoding="sparse", sparse_k=3, q_dtype="float16"),
        DraftSpec(),
    ):
        cfg = SessionConfig(prompt=PROMPT, draft=spec)
        raw = wire.config_to_proto(cfg).SerializeToString()
        assert wire.config_from_proto(pb.OpenSessionRequest.FromString(raw)) == cfg
    old = wire.config_to_proto(SessionConfig(prompt=PROMPT))
    old.ClearField("q_dtype")  # an old client's message: no field
    assert wire.config_from_proto(old).draft.q_dtype == "float32"
    old.q_dtype = 9  # an unknown value
    with pytest.raises(InvalidArgument, match="q_dtype"):
        wire.config_from_proto(old)
