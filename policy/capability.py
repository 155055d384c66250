"""What a worker reports it can do, before it loads anything heavy."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from intentserve.policy.modes import KvCacheDtype, WeightFormat


class DeviceKind(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


class BackendKind(enum.Enum):
    """Attention implementations; all but the contiguous one read a paged block pool."""

    FLASH_PAGED = "flash_paged"
    TRITON_PAGED = "triton_paged"
    TORCH_PAGED = "torch_paged"
    CONTIGUOUS = "contiguous"

    @property
    def is_paged(self) -> bool:
        return self is not BackendKind.CONTIGUOUS

    @property
    def devices(self) -> frozenset[DeviceKind]:
        """Device kinds the backend can run on at all (vllm-flash-attn and the Triton kernel are
        CUDA-only: Triton's interpreter runs the kernel on a CPU for tests, not for serving)."""
        if self in (BackendKind.FLASH_PAGED, BackendKind.TRITON_PAGED):
            return frozenset({DeviceKind.CUDA})
        return frozenset(DeviceKind)


@dataclass(frozen=True)
class BackendStatus:
    """One attention backend on this worker: does it import, and what can its cache store."""

    kind: BackendKind
    available: bool
    reason: str = ""  # why not, when unavailable (the import error text, the device it needs)
    kv_cache_dtypes: frozenset[KvCacheDtype] = frozenset()


@dataclass(frozen=True)
class WeightFormatStatus:
    """One way of holding the weights on this worker: can its kernels run here, and if not why."""

    format: WeightFormat
    available: bool
    reason: str = ""  # why not, when unavailable


@dataclass(frozen=True)
class ModelFacts:
    """Facts read from the checkpoint's metadata without loading its weights."""

    architecture: str
    has_kv_cache: bool
    head_dim: int = 0
    num_layers: int = 0
    num_kv_heads: int = 0
    max_model_len: int = 0


@dataclass(frozen=True)
class Capability:
    device_kind: DeviceKind
    model: ModelFacts
    backends: tuple[BackendStatus, ...] = ()
    # Device of each decoder layer; empty means every layer is on `device_kind`.
    layer_devices: tuple[DeviceKind, ...] = ()
    total_memory_bytes: int = 0
    free_memory_bytes: int = 0
    torch_version: str = ""
    cuda_version: str = ""
    no_kv_cache: bool = False  # debug mode: run every step without any KV cache
    weight_formats: tuple[WeightFormatStatus, ...] = ()
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def devices(self) -> frozenset[DeviceKind]:
        return frozenset(self.layer_devices) or frozenset({self.device_kind})

    @property
    def mixed_device_map(self) -> bool:
        return len(self.devices) > 1

    def backend(self, kind: BackendKind) -> BackendStatus:
        for status in self.backends:
            if status.kind is kind:
                return status
        return BackendStatus(kind, available=False, reason="not reported by the worker")

    def weight_format(self, fmt: WeightFormat) -> WeightFormatStatus:
        """Dequantized weights are the baseline every worker can hold (a worker that reports no
        formats predates the choice and dequantizes)."""
        if fmt is WeightFormat.DEQUANTIZED:
            return WeightFormatStatus(fmt, available=True)
        for status in self.weight_formats:
            if status.format is fmt:
                return status
        return WeightFormatStatus(fmt, available=False, reason="not reported by the worker")
