from intentserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_LOADING: _ClassVar[WorkerState]
    WORKER_STATE_READY: _ClassVar[WorkerState]
    WORKER_STATE_REJECTED: _ClassVar[WorkerState]
    WORKER_STATE_LOST: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
    WORKER_STATE_REGISTERED: _ClassVar[WorkerState]
    WORKER_STATE_SUSPECT: _ClassVar[WorkerState]

class DeploymentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPLOYMENT_STATE_UNSPECIFIED: _ClassVar[DeploymentState]
    DEPLOYMENT_STATE_PENDING: _ClassVar[DeploymentState]
    DEPLOYMENT_STATE_READY: _ClassVar[DeploymentState]
    DEPLOYMENT_STATE_FAILED: _ClassVar[DeploymentState]
    DEPLOYMENT_STATE_DEGRADED: _ClassVar[DeploymentState]

class TableFreshness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TABLE_FRESHNESS_UNSPECIFIED: _ClassVar[TableFreshness]
    TABLE_FRESHNESS_FRESH: _ClassVar[TableFreshness]
    TABLE_FRESHNESS_STALE: _ClassVar[TableFreshness]
    TABLE_FRESHNESS_EXPIRED: _ClassVar[TableFreshness]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_LOADING: WorkerState
WORKER_STATE_READY: WorkerState
WORKER_STATE_REJECTED: WorkerState
WORKER_STATE_LOST: WorkerState
WORKER_STATE_DRAINING: WorkerState
WORKER_STATE_REGISTERED: WorkerState
WORKER_STATE_SUSPECT: WorkerState
DEPLOYMENT_STATE_UNSPECIFIED: DeploymentState
DEPLOYMENT_STATE_PENDING: DeploymentState
DEPLOYMENT_STATE_READY: DeploymentState
DEPLOYMENT_STATE_FAILED: DeploymentState
DEPLOYMENT_STATE_DEGRADED: DeploymentState
TABLE_FRESHNESS_UNSPECIFIED: TableFreshness
TABLE_FRESHNESS_FRESH: TableFreshness
TABLE_FRESHNESS_STALE: TableFreshness
TABLE_FRESHNESS_EXPIRED: TableFreshness

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "address", "state", "device_kind", "decisions", "realized", "reasons", "num_outstanding", "num_kv_used", "num_kv_total", "last_heartbeat_age_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    REALIZED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    state: WorkerState
    device_kind: _common_pb2.DeviceKind
    decisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Decision]
    realized: _common_pb2.RealizedState
    reasons: _containers.RepeatedCompositeFieldContainer[_common_pb2.Reason]
    num_outstanding: int
    num_kv_used: int
    num_kv_total: int
    last_heartbeat_age_s: float
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., device_kind: _Optional[_Union[_common_pb2.DeviceKind, str]] = ..., decisions: _Optional[_Iterable[_Union[_common_pb2.Decision, _Mapping]]] = ..., realized: _Optional[_Union[_common_pb2.RealizedState, _Mapping]] = ..., reasons: _Optional[_Iterable[_Union[_common_pb2.Reason, _Mapping]]] = ..., num_outstanding: _Optional[int] = ..., num_kv_used: _Optional[int] = ..., num_kv_total: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("deployment", "state", "reason", "policy", "min_ready", "num_verified", "workers", "kv_budget", "weights", "scheduler", "router")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_FIELD_NUMBER: _ClassVar[int]
    NUM_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ROUTER_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    state: DeploymentState
    reason: _common_pb2.Reason
    policy: _common_pb2.PagedAttentionPolicy
    min_ready: int
    num_verified: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    kv_budget: _common_pb2.KvBudget
    weights: _common_pb2.WeightFormat
    scheduler: SchedulerSettings
    router: RouterStatus
    def __init__(self, deployment: _Optional[str] = ..., state: _Optional[_Union[DeploymentState, str]] = ..., reason: _Optional[_Union[_common_pb2.Reason, _Mapping]] = ..., policy: _Optional[_Union[_common_pb2.PagedAttentionPolicy, _Mapping]] = ..., min_ready: _Optional[int] = ..., num_verified: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., kv_budget: _Optional[_Union[_common_pb2.KvBudget, _Mapping]] = ..., weights: _Optional[_Union[_common_pb2.WeightFormat, str]] = ..., scheduler: _Optional[_Union[SchedulerSettings, _Mapping]] = ..., router: _Optional[_Union[RouterStatus, _Mapping]] = ...) -> None: ...

class RouterStatus(_message.Message):
    __slots__ = ("controller", "revision", "freshness", "stale_for_s", "max_stale_s")
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    STALE_FOR_S_FIELD_NUMBER: _ClassVar[int]
    MAX_STALE_S_FIELD_NUMBER: _ClassVar[int]
    controller: str
    revision: int
    freshness: TableFreshness
    stale_for_s: float
    max_stale_s: float
    def __init__(self, controller: _Optional[str] = ..., revision: _Optional[int] = ..., freshness: _Optional[_Union[TableFreshness, str]] = ..., stale_for_s: _Optional[float] = ..., max_stale_s: _Optional[float] = ...) -> None: ...

class SchedulerSettings(_message.Message):
    __slots__ = ("stream_interval", "max_model_len")
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    stream_interval: int
    max_model_len: int
    def __init__(self, stream_interval: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("worker_id", "lines", "worker")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    worker: WorkerStatus
    def __init__(self, worker_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., worker: _Optional[_Union[WorkerStatus, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_id", "force")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    force: bool
    def __init__(self, worker_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("state", "num_outstanding")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    state: WorkerState
    num_outstanding: int
    def __init__(self, state: _Optional[_Union[WorkerState, str]] = ..., num_outstanding: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("state", "num_outstanding")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    state: WorkerState
    num_outstanding: int
    def __init__(self, state: _Optional[_Union[WorkerState, str]] = ..., num_outstanding: _Optional[int] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchWorkersRequest(_message.Message):
    __slots__ = ("router_id",)
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    def __init__(self, router_id: _Optional[str] = ...) -> None: ...

class TableWorker(_message.Message):
    __slots__ = ("worker_id", "address", "state", "max_num_seqs", "revision", "max_model_len", "task")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    state: WorkerState
    max_num_seqs: int
    revision: int
    max_model_len: int
    task: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., max_num_seqs: _Optional[int] = ..., revision: _Optional[int] = ..., max_model_len: _Optional[int] = ..., task: _Optional[str] = ...) -> None: ...

class WorkerTableEvent(_message.Message):
    __slots__ = ("revision", "snapshot", "workers", "removed_worker_ids", "ready", "state", "reason", "keepalive_s", "controller_id")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_S_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    revision: int
    snapshot: bool
    workers: _containers.RepeatedCompositeFieldContainer[TableWorker]
    removed_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    ready: bool
    state: DeploymentState
    reason: _common_pb2.Reason
    keepalive_s: float
    controller_id: str
    def __init__(self, revision: _Optional[int] = ..., snapshot: _Optional[bool] = ..., workers: _Optional[_Iterable[_Union[TableWorker, _Mapping]]] = ..., removed_worker_ids: _Optional[_Iterable[str]] = ..., ready: _Optional[bool] = ..., state: _Optional[_Union[DeploymentState, str]] = ..., reason: _Optional[_Union[_common_pb2.Reason, _Mapping]] = ..., keepalive_s: _Optional[float] = ..., controller_id: _Optional[str] = ...) -> None: ...
