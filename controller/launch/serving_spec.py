"""`spec.model`, `spec.resources`, `spec.placement`, `spec.pagedAttention` and `spec.scheduler`:
the sections of the manifest that say what each worker serves, on what, and with which KV cache
and scheduler. `PagedAttentionSpec` is where the operator's mode is parsed, once
(docs/architecture.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from intentserve.common.chat_template import ChatTemplate
from intentserve.controller.control.state import DEFAULT_MODEL, served_name_of
from intentserve.controller.launch.section import Section, choice
from intentserve.policy import (
    DEFAULT_BLOCK_SIZE,
    BackendIntent,
    DeviceKind,
    IntentError,
    KvBudget,
    KvCacheDtype,
    Mode,
    PagedAttentionConfig,
    WeightFormat,
    paged_attention_intent,
)
from intentserve.policy.budget import KV_MEMORY_FORMS, parse_kv_memory
from intentserve.policy.config import MAX_BLOCK_SIZE, PAGED_OPTIONS
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode

# NOTE: mirrors worker.model.dtype.ALLOWED_DTYPES (controller/ never imports worker/); a test
# keeps the two equal.
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class ModelSpec(Section):
    name: str = Field(
        DEFAULT_MODEL,
        min_length=1,
        description="short name, .gguf file, folder or cached Hugging Face id",
    )
    # The name HTTP clients give as `model` (the exact reference is accepted too).
    served_name: str | None = Field(
        None, min_length=1, description="default: the short name, or the file's or folder's name"
    )
    dtype: str = "auto"
    weights: WeightFormat = WeightFormat.AUTO
    # For a checkpoint with no chat template (or the wrong one): the template's text, or the
    # path of a file holding it. Read and compiled at load; afterwards always the text.
    chat_template: str | None = Field(
        None, min_length=1, description="a Jinja chat template, or a file's path"
    )

    def served(self) -> str:
        return self.served_name or served_name_of(self.name)

    @field_validator("weights", mode="before")
    @classmethod
    def _weights(cls, value: object) -> WeightFormat:
        return choice(WeightFormat, value)

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str | None) -> str | None:
        """Text with a Jinja delimiter is the template; anything else names a file."""
        if value is None:
            return None
        if not any(mark in value for mark in ("{{", "{%")):
            try:
                value = Path(value).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(
                    "is neither a template (no {{ or {%) nor a readable file: "
                    f"{type(error).__name__}: {error}"
                ) from None
        ChatTemplate(value)  # ValueError: "chat template does not compile: ..."
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in MODEL_DTYPES:
            raise ValueError(f"allowed values are {', '.join(MODEL_DTYPES)}")
        return value


class ResourcesSpec(Section):
    device: DeviceKind = DeviceKind.CPU
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0, validate_default=True)
    device_map: tuple[str, ...] = ()  # device of each decoder layer; empty: all on `device`
    no_kv_cache: bool = False  # debug mode: the worker reports it has no KV cache at all

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: object) -> DeviceKind:
        return choice(DeviceKind, value)

    @field_validator("num_gpus")
    @classmethod
    def _gpus(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("device") is DeviceKind.CUDA and value <= 0:
            raise ValueError("must be > 0 when device is cuda (a Ray actor sees no GPU without it)")
        return value

    @field_validator("device_map")
    @classmethod
    def _device_map(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in value if not _DEVICE.fullmatch(d)]
        if bad:
            raise ValueError(f"entries must be cpu, cuda or cuda:N; {bad[0]!r} is not")
        return value


# Resources Ray defines itself; a replica asks for them through spec.resources.
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


class PlacementSpec(Section):
    """Where each replica's actor may run on a joined cluster: the custom resources (as its
    nodes offer them, `ray start --resources '{"node2": 1}'`) each replica needs, in order."""

    replica_resources: tuple[dict[str, float], ...] = ()

    @field_validator("replica_resources")
    @classmethod
    def _resources(cls, value: tuple[dict[str, float], ...]) -> tuple[dict[str, float], ...]:
        for entry in value:
            for name, amount in entry.items():
                if name in RAY_BUILTIN_RESOURCES:
                    raise ValueError(
                        f"{name!r} is set by spec.resources; entries name custom resources of "
                        "the cluster's nodes (e.g. node2: 1)"
                    )
                if amount <= 0:
                    raise ValueError(f"{name} must be more than 0, got {amount:g}")
        return value


class PagedAttentionSpec(Section):
    mode: Mode = Mode.AUTO
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=MAX_BLOCK_SIZE)
    # Applies in every mode (the contiguous cache too). NoDecode: an env override is the word
    # (`256Mi`), not JSON.
    kv_cache_memory: Annotated[KvBudget, NoDecode] = KvBudget()
    prefix_caching: Mode = Mode.AUTO
    backend: BackendIntent = BackendIntent.AUTO
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    auto_enabled_devices: tuple[DeviceKind, ...] | None = None  # default: policy's (cuda)

    @field_validator("mode", "prefix_caching", mode="before")
    @classmethod
    def _mode(cls, value: object) -> Mode:
        return choice(Mode, value)

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, value: object) -> BackendIntent:
        return choice(BackendIntent, value)

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: object) -> KvCacheDtype:
        return choice(KvCacheDtype, value)

    @field_validator("auto_enabled_devices", mode="before")
    @classmethod
    def _devices(cls, value: object) -> object:
        return [choice(DeviceKind, d) for d in value] if isinstance(value, list) else value

    @field_validator("kv_cache_memory", mode="plain")
    @classmethod
    def _kv_memory(cls, value: object) -> KvBudget:
        try:
            return parse_kv_memory(value)
        except IntentError:
            # NOTE: the manifest's line already names the field and the value given.
            raise ValueError(f"allowed: {KV_MEMORY_FORMS}") from None

    @model_validator(mode="after")
    def _intent(self) -> PagedAttentionSpec:
        self.intent()  # an IntentError names the option; validation.py places it
        return self

    def intent(self) -> PagedAttentionConfig | None:
        """The operator's policy as the typed config; an option not written is not given."""
        given = {n: getattr(self, n) for n in PAGED_OPTIONS if n in self.model_fields_set}
        return paged_attention_intent(self.mode, **given)


# NOTE: the scheduler's numbers reach the workers' reports as uint32 fields; a larger one would
# fail every worker at its report, each restart alike.
_UINT32_MAX = 2**32 - 1


class SchedulerSpec(Section):
    max_num_seqs: int = Field(16, ge=1, le=_UINT32_MAX)
    max_model_len: int | None = Field(
        None, ge=2, le=_UINT32_MAX, description="default: the model's, capped"
    )
    max_num_batched_tokens: int = Field(2048, ge=1, le=_UINT32_MAX)
    # Tokens per streamed message of each request after its first (which goes out at once); the
    # last message carries what is left. 1: every token as it comes.
    stream_interval: int = Field(1, ge=1, le=_UINT32_MAX, description="tokens per streamed message")
