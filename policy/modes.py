"""The operator's intents: one enum per kind of choice, parsed strictly from text."""

from __future__ import annotations

import enum
from typing import TypeVar

from intentserve.policy.errors import IntentError

E = TypeVar("E", bound="_ParsedEnum")
M = TypeVar("M", bound=enum.Enum)


def lookup_choice(enum_cls: type[M], value: object) -> M | None:
    """The member an operator's word names, case-insensitively; None when it names none.

    NOTE: YAML 1.1 reads a bare `on` / `off` as a boolean; that spelling counts for enums that
    have an `on` member.
    """
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, bool) and "on" in enum_cls._value2member_map_:
        value = "on" if value else "off"
    if isinstance(value, str):
        return enum_cls._value2member_map_.get(value.strip().lower())  # type: ignore[return-value]
    return None


def allowed_values(enum_cls: type[enum.Enum]) -> str:
    return ", ".join(member.value for member in enum_cls)


class _ParsedEnum(enum.Enum):
    """An enum whose values are the lower-case words an operator writes."""

    @classmethod
    def allowed(cls) -> str:
        return allowed_values(cls)

    @classmethod
    def parse(cls: type[E], value: object, field: str) -> E:
        """Parse `value` case-insensitively; anything else names `field` and the allowed values."""
        member = lookup_choice(cls, value)
        if member is None:
            raise IntentError(field, f"invalid value {value!r}; allowed values are {cls.allowed()}")
        return member


class Mode(_ParsedEnum):
    """Tri-state policy of a serving feature (see the contract in README)."""

    AUTO = "auto"  # use it where supported, else fall back and record why
    ON = "on"  # it must be realized or the worker is rejected
    OFF = "off"  # never attempt it


# The contract is one enum for every tri-state feature; the names say which feature is meant.
PagedAttentionMode = Mode
PrefixCachingMode = Mode


class BackendIntent(_ParsedEnum):
    """Which paged attention implementation the operator asks for."""

    AUTO = "auto"  # the best that imports on the worker, and say which
    FLASH = "flash"  # vllm-flash-attn; a start-up error where it does not import
    TORCH = "torch"  # the torch gather/SDPA backend (any device)
    TRITON = "triton"  # the project's Triton paged kernel (CUDA); an error where it cannot run


class KvCacheDtype(_ParsedEnum):
    """Element type of the KV cache; `auto` stores it in the model's dtype."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class WeightFormat(_ParsedEnum):
    """How a worker holds the model's projection weights (`spec.model.weights`)."""

    AUTO = "auto"  # the rule in policy/weights.py picks one, and says which and why
    DEQUANTIZED = "dequantized"  # floats in the model's dtype (a GGUF's blocks dequantized)
    INT8 = "int8"  # int8 per output channel, with a scale per channel
    INT4 = "int4"  # int4 in groups of 32 along the input, with a scale and a zero per group
    W8A8 = "w8a8"  # int8 weights and int8 activations (a scale per row): int8 dot products
    NATIVE = "native"  # a GGUF file's own blocks (Q4_0 ... Q6_K), int8 activations per 32 values
