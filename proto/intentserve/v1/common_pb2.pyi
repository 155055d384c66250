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
    MODE_AUTO: _ClassVar[Mode]
    MODE_ON: _ClassVar[Mode]
    MODE_OFF: _ClassVar[Mode]

class BackendIntent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_INTENT_UNSPECIFIED: _ClassVar[BackendIntent]
    BACKEND_INTENT_AUTO: _ClassVar[BackendIntent]
    BACKEND_INTENT_FLASH: _ClassVar[BackendIntent]
    BACKEND_INTENT_TORCH: _ClassVar[BackendIntent]
    BACKEND_INTENT_TRITON: _ClassVar[BackendIntent]

class KvCacheDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_CACHE_DTYPE_UNSPECIFIED: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_AUTO: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_FLOAT32: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_BFLOAT16: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_FLOAT16: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_FP8_E4M3: _ClassVar[KvCacheDtype]
    KV_CACHE_DTYPE_FP8_E5M2: _ClassVar[KvCacheDtype]

class WeightFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_FORMAT_UNSPECIFIED: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_AUTO: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_DEQUANTIZED: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_INT8: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_INT4: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_W8A8: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_NATIVE: _ClassVar[WeightFormat]

class DeviceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEVICE_KIND_UNSPECIFIED: _ClassVar[DeviceKind]
    DEVICE_KIND_CPU: _ClassVar[DeviceKind]
    DEVICE_KIND_CUDA: _ClassVar[DeviceKind]

class BackendKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_KIND_UNSPECIFIED: _ClassVar[BackendKind]
    BACKEND_KIND_FLASH_PAGED: _ClassVar[BackendKind]
    BACKEND_KIND_TORCH_PAGED: _ClassVar[BackendKind]
    BACKEND_KIND_CONTIGUOUS: _ClassVar[BackendKind]
    BACKEND_KIND_TRITON_PAGED: _ClassVar[BackendKind]

class CacheKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_KIND_UNSPECIFIED: _ClassVar[CacheKind]
    CACHE_KIND_PAGED: _ClassVar[CacheKind]
    CACHE_KIND_CONTIGUOUS: _ClassVar[CacheKind]
    CACHE_KIND_NONE: _ClassVar[CacheKind]

class SchedulerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULER_KIND_UNSPECIFIED: _ClassVar[SchedulerKind]
    SCHEDULER_KIND_PAGED: _ClassVar[SchedulerKind]
    SCHEDULER_KIND_DEFAULT: _ClassVar[SchedulerKind]
MODE_UNSPECIFIED: Mode
MODE_AUTO: Mode
MODE_ON: Mode
MODE_OFF: Mode
BACKEND_INTENT_UNSPECIFIED: BackendIntent
BACKEND_INTENT_AUTO: BackendIntent
BACKEND_INTENT_FLASH: BackendIntent
BACKEND_INTENT_TORCH: BackendIntent
BACKEND_INTENT_TRITON: BackendIntent
KV_CACHE_DTYPE_UNSPECIFIED: KvCacheDtype
KV_CACHE_DTYPE_AUTO: KvCacheDtype
KV_CACHE_DTYPE_FLOAT32: KvCacheDtype
KV_CACHE_DTYPE_BFLOAT16: KvCacheDtype
KV_CACHE_DTYPE_FLOAT16: KvCacheDtype
KV_CACHE_DTYPE_FP8_E4M3: KvCacheDtype
KV_CACHE_DTYPE_FP8_E5M2: KvCacheDtype
WEIGHT_FORMAT_UNSPECIFIED: WeightFormat
WEIGHT_FORMAT_AUTO: WeightFormat
WEIGHT_FORMAT_DEQUANTIZED: WeightFormat
WEIGHT_FORMAT_INT8: WeightFormat
WEIGHT_FORMAT_INT4: WeightFormat
WEIGHT_FORMAT_W8A8: WeightFormat
WEIGHT_FORMAT_NATIVE: WeightFormat
DEVICE_KIND_UNSPECIFIED: DeviceKind
DEVICE_KIND_CPU: DeviceKind
DEVICE_KIND_CUDA: DeviceKind
BACKEND_KIND_UNSPECIFIED: BackendKind
BACKEND_KIND_FLASH_PAGED: BackendKind
BACKEND_KIND_TORCH_PAGED: BackendKind
BACKEND_KIND_CONTIGUOUS: BackendKind
BACKEND_KIND_TRITON_PAGED: BackendKind
CACHE_KIND_UNSPECIFIED: CacheKind
CACHE_KIND_PAGED: CacheKind
CACHE_KIND_CONTIGUOUS: CacheKind
CACHE_KIND_NONE: CacheKind
SCHEDULER_KIND_UNSPECIFIED: SchedulerKind
SCHEDULER_KIND_PAGED: SchedulerKind
SCHEDULER_KIND_DEFAULT: SchedulerKind

class Reason(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class PagedAttentionPolicy(_message.Message):
    __slots__ = ("mode", "block_size", "prefix_caching", "backend", "kv_cache_dtype")
    MODE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHING_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    mode: Mode
    block_size: int
    prefix_caching: Mode
    backend: BackendIntent
    kv_cache_dtype: KvCacheDtype
    def __init__(self, mode: _Optional[_Union[Mode, str]] = ..., block_size: _Optional[int] = ..., prefix_caching: _Optional[_Union[Mode, str]] = ..., backend: _Optional[_Union[BackendIntent, str]] = ..., kv_cache_dtype: _Optional[_Union[KvCacheDtype, str]] = ...) -> None: ...

class KvBudget(_message.Message):
    __slots__ = ("num_bytes", "fraction")
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    num_bytes: int
    fraction: float
    def __init__(self, num_bytes: _Optional[int] = ..., fraction: _Optional[float] = ...) -> None: ...

class BackendStatus(_message.Message):
    __slots__ = ("kind", "available", "reason", "kv_cache_dtypes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPES_FIELD_NUMBER: _ClassVar[int]
    kind: BackendKind
    available: bool
    reason: str
    kv_cache_dtypes: _containers.RepeatedScalarFieldContainer[KvCacheDtype]
    def __init__(self, kind: _Optional[_Union[BackendKind, str]] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ..., kv_cache_dtypes: _Optional[_Iterable[_Union[KvCacheDtype, str]]] = ...) -> None: ...

class WeightFormatStatus(_message.Message):
    __slots__ = ("format", "available", "reason")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    format: WeightFormat
    available: bool
    reason: str
    def __init__(self, format: _Optional[_Union[WeightFormat, str]] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ModelFacts(_message.Message):
    __slots__ = ("architecture", "has_kv_cache", "head_dim", "num_layers", "num_kv_heads", "max_model_len")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    HAS_KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    has_kv_cache: bool
    head_dim: int
    num_layers: int
    num_kv_heads: int
    max_model_len: int
    def __init__(self, architecture: _Optional[str] = ..., has_kv_cache: _Optional[bool] = ..., head_dim: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class Capability(_message.Message):
    __slots__ = ("device_kind", "model", "backends", "layer_devices", "total_memory_bytes", "free_memory_bytes", "torch_version", "cuda_version", "no_kv_cache", "weight_formats")
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    LAYER_DEVICES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NO_KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMATS_FIELD_NUMBER: _ClassVar[int]
    device_kind: DeviceKind
    model: ModelFacts
    backends: _containers.RepeatedCompositeFieldContainer[BackendStatus]
    layer_devices: _containers.RepeatedScalarFieldContainer[DeviceKind]
    total_memory_bytes: int
    free_memory_bytes: int
    torch_version: str
    cuda_version: str
    no_kv_cache: bool
    weight_formats: _containers.RepeatedCompositeFieldContainer[WeightFormatStatus]
    def __init__(self, device_kind: _Optional[_Union[DeviceKind, str]] = ..., model: _Optional[_Union[ModelFacts, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[BackendStatus, _Mapping]]] = ..., layer_devices: _Optional[_Iterable[_Union[DeviceKind, str]]] = ..., total_memory_bytes: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., torch_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., no_kv_cache: _Optional[bool] = ..., weight_formats: _Optional[_Iterable[_Union[WeightFormatStatus, _Mapping]]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("feature", "mode", "enabled", "required", "reason")
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    feature: str
    mode: Mode
    enabled: bool
    required: bool
    reason: Reason
    def __init__(self, feature: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., enabled: _Optional[bool] = ..., required: _Optional[bool] = ..., reason: _Optional[_Union[Reason, _Mapping]] = ...) -> None: ...

class ResolvedConfig(_message.Message):
    __slots__ = ("policy", "decisions", "backend", "fallback_reasons", "kv_budget", "weight_intent", "weight_format", "weight_reason")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASONS_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_INTENT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_REASON_FIELD_NUMBER: _ClassVar[int]
    policy: PagedAttentionPolicy
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    backend: BackendKind
    fallback_reasons: _containers.RepeatedCompositeFieldContainer[Reason]
    kv_budget: KvBudget
    weight_intent: WeightFormat
    weight_format: WeightFormat
    weight_reason: Reason
    def __init__(self, policy: _Optional[_Union[PagedAttentionPolicy, _Mapping]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., backend: _Optional[_Union[BackendKind, str]] = ..., fallback_reasons: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ..., kv_budget: _Optional[_Union[KvBudget, _Mapping]] = ..., weight_intent: _Optional[_Union[WeightFormat, str]] = ..., weight_format: _Optional[_Union[WeightFormat, str]] = ..., weight_reason: _Optional[_Union[Reason, _Mapping]] = ...) -> None: ...

class RealizedState(_message.Message):
    __slots__ = ("cache_kind", "backend", "prefix_caching", "block_size", "num_blocks", "kv_cache_bytes", "max_num_seqs", "kv_cache_dtype", "scheduler", "fallback_reasons", "dtype", "max_model_len", "weight_format", "weight_bytes", "sliding_window", "num_windowed_layers", "stream_interval", "attention_kernel", "decode_graphs", "kernel_variant", "weights_held", "task", "embedding_dim", "reasoning")
    CACHE_KIND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHING_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASONS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    NUM_WINDOWED_LAYERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_KERNEL_FIELD_NUMBER: _ClassVar[int]
    DECODE_GRAPHS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_VARIANT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_HELD_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIM_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    cache_kind: CacheKind
    backend: BackendKind
    prefix_caching: bool
    block_size: int
    num_blocks: int
    kv_cache_bytes: int
    max_num_seqs: int
    kv_cache_dtype: str
    scheduler: SchedulerKind
    fallback_reasons: _containers.RepeatedCompositeFieldContainer[Reason]
    dtype: str
    max_model_len: int
    weight_format: WeightFormat
    weight_bytes: int
    sliding_window: int
    num_windowed_layers: int
    stream_interval: int
    attention_kernel: str
    decode_graphs: str
    kernel_variant: str
    weights_held: str
    task: str
    embedding_dim: int
    reasoning: ReasoningFormat
    def __init__(self, cache_kind: _Optional[_Union[CacheKind, str]] = ..., backend: _Optional[_Union[BackendKind, str]] = ..., prefix_caching: _Optional[bool] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., kv_cache_dtype: _Optional[str] = ..., scheduler: _Optional[_Union[SchedulerKind, str]] = ..., fallback_reasons: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ..., dtype: _Optional[str] = ..., max_model_len: _Optional[int] = ..., weight_format: _Optional[_Union[WeightFormat, str]] = ..., weight_bytes: _Optional[int] = ..., sliding_window: _Optional[int] = ..., num_windowed_layers: _Optional[int] = ..., stream_interval: _Optional[int] = ..., attention_kernel: _Optional[str] = ..., decode_graphs: _Optional[str] = ..., kernel_variant: _Optional[str] = ..., weights_held: _Optional[str] = ..., task: _Optional[str] = ..., embedding_dim: _Optional[int] = ..., reasoning: _Optional[_Union[ReasoningFormat, _Mapping]] = ...) -> None: ...

class ReasoningFormat(_message.Message):
    __slots__ = ("start", "end", "opened_by_template")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    OPENED_BY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    start: str
    end: str
    opened_by_template: bool
    def __init__(self, start: _Optional[str] = ..., end: _Optional[str] = ..., opened_by_template: _Optional[bool] = ...) -> None: ...
