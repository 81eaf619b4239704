"""The protocol's Python types <-> their `jaxspec.v1` protobuf messages (docs/design.md §4).

Both transports' ends (the gRPC server in `verify`, the client in `edge`) and the wire-cost
benchmark convert here, so a field means the same thing everywhere. Decoding checks what the
message layout itself can get wrong (unknown enum values, a q that is not `n x something`, a
float16 q that is not whole float16 values with one finite positive scale per draft) and
builds the protocol's validated types (`SamplingSettings`, `DraftSpec`): the wire is a trust
boundary, and a config off it is checked as it is made, as one made in-process is.
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
    q_from_f16,
    q_to_f16,
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
_F16 = np.dtype("<f2")  # q_f16: little-endian float16, whatever the machine's byte order


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
    """q travels as float32 (what the drafter computes in), row-major; a block with `q_scale`
    (a float16 session) sends q as float16 values + the scales instead (`q_f16`, `q_scale`),
    refusing (`InvalidArgument`) a q that is not exactly such values times its scales."""
    ids = () if b.q_ids is None else np.asarray(b.q_ids, np.int32).ravel()
    q: dict = {"q": () if b.q is None else np.asarray(b.q, np.float32).ravel()}
    if b.q_scale is not None:
        if b.q is None:
            raise InvalidArgument("a block with q_scale needs q")
        scale = np.asarray(b.q_scale, np.float32)
        q = {"q_f16": q_to_f16(b.q, scale).astype(_F16).tobytes(), "q_scale": scale}
    return pb.DraftBlock(
        session_id=b.session_id, epoch=b.epoch, start=b.start, tokens=b.tokens, q_ids=ids, **q
    )


def _rows(values, n: int, dtype, what: str) -> np.ndarray | None:
    if not len(values):
        return None
    if n == 0 or len(values) % n:
        raise InvalidArgument(f"{what} holds {len(values)} values: not {n} equal rows")
    return np.asarray(values, dtype).reshape(n, -1)


def _f16_q(m: pb.DraftBlock, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(q, q_scale) of a block: float32 `q` as sent (no scale), or rebuilt from `q_f16` and
    `q_scale` exactly as the edge computed it (`jaxspec.protocol.q_from_f16`)."""
    if not m.q_f16 and not len(m.q_scale):
        return _rows(m.q, n, np.float32, "q"), None
    if len(m.q):
        raise InvalidArgument("a block carries q or q_f16 + q_scale, not both")
    if not m.q_f16 or not len(m.q_scale):
        raise InvalidArgument("q_f16 and q_scale travel together")
    if len(m.q_f16) % _F16.itemsize:
        raise InvalidArgument(f"q_f16 holds {len(m.q_f16)} bytes: not float16 values")
    q16 = _rows(np.frombuffer(m.q_f16, _F16), n, np.float16, "q_f16")
    if len(m.q_scale) != n:
        raise InvalidArgument(f"q_scale holds {len(m.q_scale)} values: not one per draft ({n})")
    scale = np.asarray(m.q_scale, np.float32)
    return q_from_f16(q16, scale), scale


def block_from_proto(m: pb.DraftBlock) -> DraftBlock:
    n = len(m.tokens)
    q, scale = _f16_q(m, n)
    return DraftBlock(
        session_id=m.session_id,
        epoch=m.epoch,
        start=m.start,
        tokens=tuple(m.tokens),
        q=q,
        q_ids=_rows(m.q_ids, n, np.int64, "q_ids"),
        q_scale=scale,
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
