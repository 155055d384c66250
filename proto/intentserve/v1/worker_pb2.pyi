from google.protobuf import any_pb2 as _any_pb2
from intentserve.v1 import common_pb2 as _common_pb2
from intentserve.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeartbeatAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEARTBEAT_ACTION_UNSPECIFIED: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_CONTINUE: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_REGISTER: _ClassVar[HeartbeatAction]
    HEARTBEAT_ACTION_DRAIN: _ClassVar[HeartbeatAction]
HEARTBEAT_ACTION_UNSPECIFIED: HeartbeatAction
HEARTBEAT_ACTION_CONTINUE: HeartbeatAction
HEARTBEAT_ACTION_REGISTER: HeartbeatAction
HEARTBEAT_ACTION_DRAIN: HeartbeatAction

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "address", "capability", "registration_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    capability: _common_pb2.Capability
    registration_token: bytes
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., capability: _Optional[_Union[_common_pb2.Capability, _Mapping]] = ..., registration_token: _Optional[bytes] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("config", "rejection", "heartbeat_interval_s", "registration_token")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    config: _common_pb2.ResolvedConfig
    rejection: _common_pb2.Reason
    heartbeat_interval_s: float
    registration_token: bytes
    def __init__(self, config: _Optional[_Union[_common_pb2.ResolvedConfig, _Mapping]] = ..., rejection: _Optional[_Union[_common_pb2.Reason, _Mapping]] = ..., heartbeat_interval_s: _Optional[float] = ..., registration_token: _Optional[bytes] = ...) -> None: ...

class RealizedReport(_message.Message):
    __slots__ = ("worker_id", "realized", "load_error", "registration_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REALIZED_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    realized: _common_pb2.RealizedState
    load_error: _common_pb2.Reason
    registration_token: bytes
    def __init__(self, worker_id: _Optional[str] = ..., realized: _Optional[_Union[_common_pb2.RealizedState, _Mapping]] = ..., load_error: _Optional[_Union[_common_pb2.Reason, _Mapping]] = ..., registration_token: _Optional[bytes] = ...) -> None: ...

class Verification(_message.Message):
    __slots__ = ("verified", "reason")
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    verified: bool
    reason: _common_pb2.Reason
    def __init__(self, verified: _Optional[bool] = ..., reason: _Optional[_Union[_common_pb2.Reason, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "num_running", "num_waiting", "num_kv_used", "num_kv_total", "num_preemptions", "num_prefix_queried_tokens", "num_prefix_hit_tokens", "registration_token", "num_steps", "total_step_s", "num_step_seqs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_QUERIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEP_S_FIELD_NUMBER: _ClassVar[int]
    NUM_STEP_SEQS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    num_running: int
    num_waiting: int
    num_kv_used: int
    num_kv_total: int
    num_preemptions: int
    num_prefix_queried_tokens: int
    num_prefix_hit_tokens: int
    registration_token: bytes
    num_steps: int
    total_step_s: float
    num_step_seqs: int
    def __init__(self, worker_id: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_kv_used: _Optional[int] = ..., num_kv_total: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_prefix_queried_tokens: _Optional[int] = ..., num_prefix_hit_tokens: _Optional[int] = ..., registration_token: _Optional[bytes] = ..., num_steps: _Optional[int] = ..., total_step_s: _Optional[float] = ..., num_step_seqs: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: HeartbeatAction
    def __init__(self, action: _Optional[_Union[HeartbeatAction, str]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "capability", "realized", "model")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    REALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    capability: _common_pb2.Capability
    realized: _common_pb2.RealizedState
    model: str
    def __init__(self, worker_id: _Optional[str] = ..., capability: _Optional[_Union[_common_pb2.Capability, _Mapping]] = ..., realized: _Optional[_Union[_common_pb2.RealizedState, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class StreamCommand(_message.Message):
    __slots__ = ("stream", "start", "cancel", "timeout_s")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    stream: int
    start: _inference_pb2.GenerateRequest
    cancel: bool
    timeout_s: float
    def __init__(self, stream: _Optional[int] = ..., start: _Optional[_Union[_inference_pb2.GenerateRequest, _Mapping]] = ..., cancel: _Optional[bool] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "details", "status_details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    status_details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ..., status_details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class StreamEvent(_message.Message):
    __slots__ = ("stream", "output", "error")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    stream: int
    output: _inference_pb2.GenerateResponse
    error: StreamError
    def __init__(self, stream: _Optional[int] = ..., output: _Optional[_Union[_inference_pb2.GenerateResponse, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class StreamEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StreamEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StreamEvent, _Mapping]]] = ...) -> None: ...
