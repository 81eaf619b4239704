"""The protocol's Python types <-> their `jaxspec.v1` protobuf messages (docs/design.md §4).

Both transports' ends (the gRPC server in `verify`, the client in `edge`) and the wire-cost
benchmark convert here, so a field means the same thing everywhere. Decoding checks what the
message layout itself can get wrong (unknown enum values, a q that is not `n x something` or
comes in two forms, a float16 q that is not whole float16 values with one scale per draft)
and builds the protocol's validated types (`SamplingSettings`, `DraftSpec`, `DraftBlock`,
whose q values are checked as the block is made): the wire is a trust boundary, and what
comes off it is checked as it is made, once, as what is made in-process is. q itself crosses
as packed bytes (`q_f32`, `q_f16`), read and written in place, never value by value.
Everything that needs the session or the model (vocabulary, gamma limits, epochs) is the
scheduler's to check, with the same errors as in-process.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspec.figures import AcceptanceFigures
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.protocol import (
    DraftBlock,
    DraftSpec,
    InvalidArgument,
    SamplingSettings,
    SessionConfig,
    SessionInfo,
    VerifyResult,
)

_MODES = {pb.MODE_UNSPECIFIED: "sync", pb.MODE_SYNC: "sync", pb.MODE_PIPELINED: "pipelined"}
_ENCODINGS = {
    pb.ENCODING_UNSPECIFIED: "full",
    pb.ENCODING_FULL: "full",
    pb.ENCODING_SPARSE: "sparse",
    pb.ENCODING_ONEHOT: "onehot",
}
_Q_DTYPES = {
    pb.Q_DTYPE_UNSPECIFIED: "float32",
    pb.Q_DTYPE_FLOAT32: "float32",
    pb.Q_DTYPE_FLOAT16: "float16",
}
# q_f16, q_f32: little-endian float16 / float32, whatever the machine's byte order
_F16 = np.dtype("<f2")
_F32 = np.dtype("<f4")


def _enum(value: int, table: dict[int, str], what: str) -> str:
    if value not in table:
        raise InvalidArgument(f"unknown {what} {value}")
    return table[value]


def _code(name: str, table: dict[int, str]) -> int:
    return next(k for k, v in table.items() if v == name and k != 0)


def config_to_proto(c: SessionConfig) -> pb.OpenSessionRequest:
    if c.mode not in _MODES.values():
        raise InvalidArgument(f"unknown mode {c.mode!r}")
    return pb.OpenSessionRequest(
        prompt=c.prompt,
        max_new_tokens=c.max_new_tokens,
        **_sampling_fields(c.sampling),
        seed=c.seed,
        mode=_code(c.mode, _MODES),
        gamma=c.draft.gamma,
        encoding=_code(c.draft.encoding, _ENCODINGS),
        sparse_k=c.draft.sparse_k,
        adaptive_gamma=c.draft.adaptive,
        q_dtype=_code(c.draft.q_dtype, _Q_DTYPES),
        stop_tokens=c.stop_tokens or (),
        default_stop_tokens=c.stop_tokens is None,
        committed=c.committed,
    )


def _sampling_fields(s: SamplingSettings) -> dict:
    """The request's sampling fields (the proto's flat names) of `s`."""
    fields = dataclasses.asdict(s)  # the same names, the bias a map
    return fields | {"logit_bias": dict(s.logit_bias)}


def sampling_from_proto(m: pb.OpenSessionRequest) -> SamplingSettings:
    """The request's `SamplingSettings`: made here, so a bad value is refused as the config
    comes off the wire (`InvalidArgument`), before it reaches the verifier's scheduler."""
    return SamplingSettings(
        temperature=m.temperature,
        top_k=m.top_k,
        top_p=1.0 if m.top_p == 0 else m.top_p,  # 0 is proto3's "unset": off, as 1 is
        min_p=m.min_p,
        logit_bias=m.logit_bias.items(),
        # unset: off (1); a value that is set is checked as given (0 is INVALID_ARGUMENT)
        repetition_penalty=(m.repetition_penalty if m.HasField("repetition_penalty") else 1.0),
        presence_penalty=m.presence_penalty,
        frequency_penalty=m.frequency_penalty,
    )


def config_from_proto(m: pb.OpenSessionRequest) -> SessionConfig:
    """The `SessionConfig` of a request; `InvalidArgument` for an unknown enum value or a
    sampling or draft value out of range (the trust boundary's check)."""
    return SessionConfig(
        prompt=tuple(m.prompt),
        max_new_tokens=m.max_new_tokens,
        sampling=sampling_from_proto(m),
        seed=m.seed,
        mode=_enum(m.mode, _MODES, "mode"),
        draft=DraftSpec(
            gamma=m.gamma,
            encoding=_enum(m.encoding, _ENCODINGS, "encoding"),
            sparse_k=m.sparse_k,
            adaptive=m.adaptive_gamma,
            q_dtype=_enum(m.q_dtype, _Q_DTYPES, "q_dtype"),
        ),
        stop_tokens=None if m.default_stop_tokens else tuple(m.stop_tokens),
        committed=tuple(m.committed),
    )


def info_to_proto(i: SessionInfo) -> pb.OpenSessionResponse:
    return pb.OpenSessionResponse(**dataclasses.asdict(i))  # the same fields, by name


def info_from_proto(m: pb.OpenSessionResponse) -> SessionInfo:
    return SessionInfo(**{f.name: getattr(m, f.name) for f in dataclasses.fields(SessionInfo)})


def block_to_proto(b: DraftBlock) -> pb.DraftBlock:
    """q travels as packed little-endian float32 (`q_f32`, row-major: the very values the
    edge sampled from, one copy into bytes); a float16 block (one with `q_scale`) sends its
    float16 values `q16` and the scales instead (`q_f16`, `q_scale`). The block was checked
    as it was made, so nothing is checked or converted value by value here."""
    ids = () if b.q_ids is None else np.asarray(b.q_ids, np.int32).ravel()
    q: dict = {}
    if b.q16 is not None:
        q = {"q_f16": b.q16.astype(_F16, copy=False).tobytes(), "q_scale": b.q_scale}
    elif b.q is not None:
        q = {"q_f32": b.q.astype(_F32, copy=False).tobytes()}
    return pb.DraftBlock(
        session_id=b.session_id, epoch=b.epoch, start=b.start, tokens=b.tokens, q_ids=ids, **q
    )


def _rows(values, n: int, dtype, what: str) -> np.ndarray | None:
    if not len(values):
        return None
    if n == 0 or len(values) % n:
        raise InvalidArgument(f"{what} holds {len(values)} values: not {n} equal rows")
    return np.asarray(values, dtype).reshape(n, -1)


def _packed(raw: bytes, dtype: np.dtype, what: str) -> np.ndarray:
    """The values of a packed field (`q_f32`, `q_f16`), read in place (no copy)."""
    if len(raw) % dtype.itemsize:
        raise InvalidArgument(f"{what} holds {len(raw)} bytes: not {dtype.name} values")
    return np.frombuffer(raw, dtype)


def _q_fields(m: pb.DraftBlock, n: int) -> dict:
    """The block's q as `DraftBlock` fields, from whichever one form the message carries:
    `q_f32` (packed float32: what clients send), `q` (repeated float: clients before
    `q_f32`), or `q_f16` + `q_scale` (float16 sessions; the block rebuilds q from them
    exactly as the edge computed it, `jaxspec.protocol.q_from_f16`)."""
    there = {
        "q": len(m.q) > 0,
        "q_f32": bool(m.q_f32),
        "q_f16": bool(m.q_f16) or len(m.q_scale) > 0,
    }
    if sum(map(bool, there.values())) > 1:
        forms = " and ".join(f for f, x in there.items() if x)
        raise InvalidArgument(f"a block carries one of q, q_f32, q_f16 + q_scale, not {forms}")
    if m.q_f32:
        return {"q": _rows(_packed(m.q_f32, _F32, "q_f32"), n, _F32, "q_f32")}
    if not m.q_f16 and not len(m.q_scale):
        return {"q": _rows(m.q, n, np.float32, "q")}
    if not m.q_f16 or not len(m.q_scale):
        raise InvalidArgument("q_f16 and q_scale travel together")
    q16 = _rows(_packed(m.q_f16, _F16, "q_f16"), n, _F16, "q_f16")
    if len(m.q_scale) != n:
        raise InvalidArgument(f"q_scale holds {len(m.q_scale)} values: not one per draft ({n})")
    return {"q16": q16, "q_scale": np.asarray(m.q_scale, np.float32)}


def block_from_proto(m: pb.DraftBlock) -> DraftBlock:
    """The message's `DraftBlock`: made (and so checked, once: `DraftBlock`) from the form
    its q came in; `InvalidArgument` for a layout that is not n rows or for bad values."""
    n = len(m.tokens)
    return DraftBlock(
        session_id=m.session_id,
        epoch=m.epoch,
        start=m.start,
        tokens=tuple(m.tokens),
        q_ids=_rows(m.q_ids, n, np.int64, "q_ids"),
        **_q_fields(m, n),
    )


def result_to_proto(r: VerifyResult) -> pb.VerifyResult:
    return pb.VerifyResult(
        epoch=r.epoch,
        start=r.start,
        accepted=r.accepted,
        tokens=r.tokens,
        has_next_token=r.next_token is not None,
        next_token=r.next_token or 0,
        new_epoch=r.new_epoch,
        stale=r.stale,
        finished=r.finished,
        figures=pb.AcceptanceFigures(**dataclasses.asdict(r.figures)),  # the same fields
        step_s=r.step_s,
    )


def result_from_proto(m: pb.VerifyResult) -> VerifyResult:
    return VerifyResult(
        epoch=m.epoch,
        start=m.start,
        accepted=m.accepted,
        tokens=tuple(m.tokens),
        next_token=m.next_token if m.has_next_token else None,
        new_epoch=m.new_epoch,
        stale=m.stale,
        finished=m.finished,
        figures=AcceptanceFigures(
            num_drafts=m.figures.num_drafts,
            num_draft_tokens=m.figures.num_draft_tokens,
            num_accepted_tokens=m.figures.num_accepted_tokens,
            accepted_per_position=tuple(m.figures.accepted_per_position),
            rounds=m.figures.rounds,
            emitted=m.figures.emitted,
        ),
        step_s=m.step_s,
    )
