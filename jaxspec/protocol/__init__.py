"""The edge <-> verifier session protocol as Python types (docs/design.md §4).

`verify` implements `VerifierEndpoint` in-process (`LocalVerifier`) and behind gRPC; `edge`
consumes any endpoint. Neither imports the other: both meet here. Errors carry the gRPC
status they map to, so every transport reports the same precise status. The types live in
`errors`, `settings` (DraftSpec, SamplingSettings), `blocks` (DraftBlock and its q) and
`session` (SessionConfig, SessionInfo, VerifyResult, VerifierEndpoint); `wire` is their
protobuf form.
"""

from jaxspec.protocol.blocks import (
    Q_SUM_TOLERANCE,
    DraftBlock,
    check_q,
    q_from_f16,
    q_to_f16,
)
from jaxspec.protocol.errors import (
    ERRORS,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    VerifierError,
)
from jaxspec.protocol.session import (
    SessionConfig,
    SessionInfo,
    VerifierEndpoint,
    VerifyResult,
)
from jaxspec.protocol.settings import (
    ENCODINGS,
    GAMMA_CEILING,
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS,
    MODES,
    PENALTY_LIMIT,
    Q_DTYPES,
    REPETITION_PENALTY_RANGE,
    DraftSpec,
    SamplingSettings,
)

__all__ = [
    "ENCODINGS",
    "ERRORS",
    "GAMMA_CEILING",
    "LOGIT_BIAS_LIMIT",
    "MAX_LOGIT_BIAS",
    "MODES",
    "PENALTY_LIMIT",
    "Q_DTYPES",
    "Q_SUM_TOLERANCE",
    "REPETITION_PENALTY_RANGE",
    "DeadlineExceeded",
    "DraftBlock",
    "DraftSpec",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SamplingSettings",
    "SessionConfig",
    "SessionInfo",
    "Unauthenticated",
    "Unavailable",
    "VerifierEndpoint",
    "VerifierError",
    "VerifyResult",
    "check_q",
    "q_from_f16",
    "q_to_f16",
]
