from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_SYNC: _ClassVar[Mode]
    MODE_PIPELINED: _ClassVar[Mode]

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    ENCODING_FULL: _ClassVar[Encoding]
    ENCODING_SPARSE: _ClassVar[Encoding]
    ENCODING_ONEHOT: _ClassVar[Encoding]

class QDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Q_DTYPE_UNSPECIFIED: _ClassVar[QDtype]
    Q_DTYPE_FLOAT32: _ClassVar[QDtype]
    Q_DTYPE_FLOAT16: _ClassVar[QDtype]
MODE_UNSPECIFIED: Mode
MODE_SYNC: Mode
MODE_PIPELINED: Mode
ENCODING_UNSPECIFIED: Encoding
ENCODING_FULL: Encoding
ENCODING_SPARSE: Encoding
ENCODING_ONEHOT: Encoding
Q_DTYPE_UNSPECIFIED: QDtype
Q_DTYPE_FLOAT32: QDtype
Q_DTYPE_FLOAT16: QDtype

class OpenSessionRequest(_message.Message):
    __slots__ = ("prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "mode", "gamma", "encoding", "sparse_k", "stop_tokens", "default_stop_tokens", "committed", "adaptive_gamma", "min_p", "logit_bias", "q_dtype", "repetition_penalty", "presence_penalty", "frequency_penalty")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SPARSE_K_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_GAMMA_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    Q_DTYPE_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    prompt: _containers.RepeatedScalarFieldContainer[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    mode: Mode
    gamma: int
    encoding: Encoding
    sparse_k: int
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    default_stop_tokens: bool
    committed: _containers.RepeatedScalarFieldContainer[int]
    adaptive_gamma: bool
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    q_dtype: QDtype
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, prompt: _Optional[_Iterable[int]] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ..., gamma: _Optional[int] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., sparse_k: _Optional[int] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., default_stop_tokens: _Optional[bool] = ..., committed: _Optional[_Iterable[int]] = ..., adaptive_gamma: _Optional[bool] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., q_dtype: _Optional[_Union[QDtype, str]] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "gamma", "max_sparse_k", "vocab_size", "max_new_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    MAX_SPARSE_K_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    gamma: int
    max_sparse_k: int
    vocab_size: int
    max_new_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., gamma: _Optional[int] = ..., max_sparse_k: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class DraftBlock(_message.Message):
    __slots__ = ("session_id", "epoch", "start", "tokens", "q", "q_ids", "q_f16", "q_scale", "q_f32")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    Q_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_F16_FIELD_NUMBER: _ClassVar[int]
    Q_SCALE_FIELD_NUMBER: _ClassVar[int]
    Q_F32_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    start: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    q: _containers.RepeatedScalarFieldContainer[float]
    q_ids: _containers.RepeatedScalarFieldContainer[int]
    q_f16: bytes
    q_scale: _containers.RepeatedScalarFieldContainer[float]
    q_f32: bytes
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., start: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., q: _Optional[_Iterable[float]] = ..., q_ids: _Optional[_Iterable[int]] = ..., q_f16: _Optional[bytes] = ..., q_scale: _Optional[_Iterable[float]] = ..., q_f32: _Optional[bytes] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("epoch", "start", "accepted", "tokens", "has_next_token", "next_token", "new_epoch", "stale", "finished", "figures", "step_s")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    HAS_NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEW_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start: int
    accepted: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    has_next_token: bool
    next_token: int
    new_epoch: int
    stale: bool
    finished: bool
    figures: AcceptanceFigures
    step_s: float
    def __init__(self, epoch: _Optional[int] = ..., start: _Optional[int] = ..., accepted: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., has_next_token: _Optional[bool] = ..., next_token: _Optional[int] = ..., new_epoch: _Optional[int] = ..., stale: _Optional[bool] = ..., finished: _Optional[bool] = ..., figures: _Optional[_Union[AcceptanceFigures, _Mapping]] = ..., step_s: _Optional[float] = ...) -> None: ...

class AcceptanceFigures(_message.Message):
    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "rounds", "emitted")
    NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    EMITTED_FIELD_NUMBER: _ClassVar[int]
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    rounds: int
    emitted: int
    def __init__(self, num_drafts: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., rounds: _Optional[int] = ..., emitted: _Optional[int] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("open", "block")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    open: OpenSessionRequest
    block: DraftBlock
    def __init__(self, open: _Optional[_Union[OpenSessionRequest, _Mapping]] = ..., block: _Optional[_Union[DraftBlock, _Mapping]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("opened", "result")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    opened: OpenSessionResponse
    result: VerifyResult
    def __init__(self, opened: _Optional[_Union[OpenSessionResponse, _Mapping]] = ..., result: _Optional[_Union[VerifyResult, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("sessions", "queued_blocks", "steps", "last_step_s", "last_rows", "last_bucket_rows", "mean_occupancy", "tokens_committed", "serving", "warming_done", "warming_total", "vocab_size")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ROWS_FIELD_NUMBER: _ClassVar[int]
    LAST_BUCKET_ROWS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    WARMING_DONE_FIELD_NUMBER: _ClassVar[int]
    WARMING_TOTAL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    queued_blocks: int
    steps: int
    last_step_s: float
    last_rows: int
    last_bucket_rows: int
    mean_occupancy: float
    tokens_committed: int
    serving: bool
    warming_done: int
    warming_total: int
    vocab_size: int
    def __init__(self, sessions: _Optional[int] = ..., queued_blocks: _Optional[int] = ..., steps: _Optional[int] = ..., last_step_s: _Optional[float] = ..., last_rows: _Optional[int] = ..., last_bucket_rows: _Optional[int] = ..., mean_occupancy: _Optional[float] = ..., tokens_committed: _Optional[int] = ..., serving: _Optional[bool] = ..., warming_done: _Optional[int] = ..., warming_total: _Optional[int] = ..., vocab_size: _Optional[int] = ...) -> None: ...
