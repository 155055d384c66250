"""Named example workers and the decision table they produce.

The CLI prints this table (`intentserve policy-table`), README shows it, and a test keeps the two
identical, so the documented contract is always the implemented one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from intentserve.policy.capability import (
    BackendKind,
    BackendStatus,
    Capability,
    DeviceKind,
    ModelFacts,
)
from intentserve.policy.config import paged_attention_config
from intentserve.policy.modes import KvCacheDtype, Mode
from intentserve.policy.resolution import resolve

FLOAT_DTYPES = frozenset({KvCacheDtype.FLOAT32, KvCacheDtype.BFLOAT16, KvCacheDtype.FLOAT16})
LLAMA = ModelFacts(
    "LlamaForCausalLM", has_kv_cache=True, head_dim=64, num_layers=30, num_kv_heads=3
)
BERT = ModelFacts("BertModel", has_kv_cache=False)


FP8_DTYPES = frozenset({KvCacheDtype.FP8_E4M3, KvCacheDtype.FP8_E5M2})


def backends(
    *, flash: bool, triton: bool = True, torch_paged: bool = True
) -> tuple[BackendStatus, ...]:
    return (
        BackendStatus(
            BackendKind.FLASH_PAGED,
            flash,
            "" if flash else "No module named 'vllm_flash_attn'",
            FLOAT_DTYPES - {KvCacheDtype.FLOAT32} if flash else frozenset(),
        ),
        BackendStatus(
            BackendKind.TRITON_PAGED,
            triton,
            "" if triton else "the Triton paged kernel needs a CUDA device; this worker is cpu",
            FLOAT_DTYPES | FP8_DTYPES if triton else frozenset(),
        ),
        BackendStatus(
            BackendKind.TORCH_PAGED,
            torch_paged,
            "" if torch_paged else "torch was built without scaled_dot_product_attention",
            FLOAT_DTYPES if torch_paged else frozenset(),
        ),
        BackendStatus(BackendKind.CONTIGUOUS, True, "", FLOAT_DTYPES),
    )


GIB = 1 << 30
MEMORY = {"total_memory_bytes": 16 * GIB, "free_memory_bytes": 12 * GIB}


def cpu(**overrides) -> Capability:
    base = Capability(
        device_kind=DeviceKind.CPU,
        model=LLAMA,
        backends=backends(flash=False, triton=False),
        **MEMORY,
    )
    return replace(base, **overrides)


def cuda(*, flash: bool = True, **overrides) -> Capability:
    base = Capability(
        device_kind=DeviceKind.CUDA, model=LLAMA, backends=backends(flash=flash), **MEMORY
    )
    return replace(base, **overrides)


def kv_bytes_per_token(model: ModelFacts, element_bytes: int = 4) -> int:
    """K and V of one token over all layers, as an engine stores them (float32 by default)."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * element_bytes


def mixed() -> Capability:
    return cuda(layer_devices=(DeviceKind.CUDA,) * 20 + (DeviceKind.CPU,) * 10)


@dataclass(frozen=True)
class ExampleWorker:
    """One row group of the table: a worker, and the kv_cache_dtype the operator asks of it."""

    name: str
    capability: Capability
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO


SITUATIONS: tuple[ExampleWorker, ...] = (
    ExampleWorker("cpu", cpu()),
    ExampleWorker("cuda, vllm-flash-attn imports", cuda()),
    ExampleWorker(
        "cuda, vllm-flash-attn imports, kv_cache_dtype float32", cuda(), KvCacheDtype.FLOAT32
    ),
    ExampleWorker("cuda, vllm-flash-attn missing (a current torch)", cuda(flash=False)),
    ExampleWorker(
        "cuda, vllm-flash-attn missing, kv_cache_dtype fp8_e4m3",
        cuda(flash=False),
        KvCacheDtype.FP8_E4M3,
    ),
    ExampleWorker("layers on cpu and cuda", mixed()),
    ExampleWorker(
        "no paged backend in the build",
        cuda(backends=backends(flash=False, triton=False, torch_paged=False)),
    ),
    ExampleWorker("encoder model (no KV cache)", cpu(model=BERT)),
    ExampleWorker("no_kv_cache debug mode", cpu(no_kv_cache=True)),
)


@dataclass(frozen=True)
class TableRow:
    situation: str
    mode: Mode
    outcome: str  # "paged (backend)", "default (fallback)", "default" or "REJECTED"
    reason: str  # the reason code that decided it


def decision_table() -> list[TableRow]:
    rows = []
    for worker in SITUATIONS:
        for mode in Mode:
            # NOTE: `off` takes no option (a kv_cache_dtype could never take effect there).
            dtype = worker.kv_cache_dtype if mode is not Mode.OFF else None
            config = paged_attention_config(mode, kv_cache_dtype=dtype)
            resolution = resolve(config, worker.capability)
            paged = resolution.paged_attention
            if not resolution.accepted:
                outcome = "REJECTED: start-up error"
            elif paged.enabled:
                outcome = f"paged ({resolution.backend.kind.value})"
            elif mode is Mode.AUTO:
                outcome = "default scheduler (fallback)"
            else:
                outcome = "default scheduler"
            reason = (resolution.backend.reason or paged.reason).code.value
            rows.append(TableRow(worker.name, mode, outcome, reason))
    return rows


def render_markdown(rows: list[TableRow]) -> str:
    lines = ["| worker | mode | outcome | reason code |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.situation} | `{r.mode.value}` | {r.outcome} | `{r.reason}` |" for r in rows]
    return "\n".join(lines)
