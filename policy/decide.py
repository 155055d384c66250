"""Checkpoint 1, the device/build boundary: intent x capability -> decision.

Each tri-state feature is a row of `RULES`: checks that block it in every mode, and checks that
only keep `auto` from enabling it. Adding a feature is adding a row, not new plumbing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from intentserve.policy.capability import BackendKind, Capability, DeviceKind
from intentserve.policy.config import PagedAttentionConfig, mode_of
from intentserve.policy.modes import BackendIntent, KvCacheDtype, Mode
from intentserve.policy.reasons import Reason, ReasonCode

# Device kinds on which `auto` turns PagedAttention on (the seed system's default: CUDA only).
DEFAULT_AUTO_DEVICES: frozenset[DeviceKind] = frozenset({DeviceKind.CUDA})

# Preference order when the backend intent is `auto`, fastest first: vllm-flash-attn, then the
# Triton kernel (one launch a layer for a whole mixed step, K/V read in place through the block
# table), then torch's gather + SDPA (a gather copy of every context and one SDPA call per
# prefill chunk). `make gpu-check` measures the three side by side (docs/benchmarks.md).
_PAGED_BACKENDS_BY_INTENT: dict[BackendIntent, tuple[BackendKind, ...]] = {
    BackendIntent.AUTO: (
        BackendKind.FLASH_PAGED,
        BackendKind.TRITON_PAGED,
        BackendKind.TORCH_PAGED,
    ),
    BackendIntent.FLASH: (BackendKind.FLASH_PAGED,),
    BackendIntent.TRITON: (BackendKind.TRITON_PAGED,),
    BackendIntent.TORCH: (BackendKind.TORCH_PAGED,),
}


class Feature(enum.Enum):
    PAGED_ATTENTION = "paged_attention"
    PREFIX_CACHING = "prefix_caching"


@dataclass(frozen=True)
class Decision:
    feature: Feature
    mode: Mode
    enabled: bool
    required: bool
    reason: Reason

    @property
    def accepted(self) -> bool:
        """False only when a required feature cannot be realized: the worker is rejected."""
        return self.enabled or not self.required

    def describe(self) -> str:
        state = "enabled" if self.enabled else ("REJECTED" if not self.accepted else "disabled")
        return f"{self.feature.value} ({self.mode.value}): {state} - {self.reason.message}"


@dataclass(frozen=True)
class Situation:
    """Everything a check may look at."""

    config: PagedAttentionConfig | None
    capability: Capability
    auto_devices: frozenset[DeviceKind]
    paged: Decision | None = None  # the upstream decision, for features that live in the paged pool


Check = Callable[[Situation], "Reason | None"]


def _candidates(s: Situation) -> tuple[BackendKind, ...]:
    """Backends the intent allows; `auto` only considers those that can run on this device."""
    intent = s.config.backend if s.config is not None else BackendIntent.AUTO
    allowed = _PAGED_BACKENDS_BY_INTENT[intent]
    if intent is not BackendIntent.AUTO:
        return allowed
    return tuple(k for k in allowed if s.capability.device_kind in k.devices)


def _available_candidates(s: Situation) -> tuple[BackendKind, ...]:
    return tuple(k for k in _candidates(s) if s.capability.backend(k).available)


def _kv_cache_dtype(s: Situation) -> KvCacheDtype:
    return s.config.kv_cache_dtype if s.config is not None else KvCacheDtype.AUTO


def _stores_kv_cache_dtype(s: Situation, kind: BackendKind) -> bool:
    dtype = _kv_cache_dtype(s)
    return dtype is KvCacheDtype.AUTO or dtype in s.capability.backend(kind).kv_cache_dtypes


def _usable_candidates(s: Situation) -> tuple[BackendKind, ...]:
    """Available candidates whose cache can store the requested kv_cache_dtype, best first."""
    return tuple(k for k in _available_candidates(s) if _stores_kv_cache_dtype(s, k))


def _stored_dtypes(s: Situation, kind: BackendKind) -> str:
    dtypes = s.capability.backend(kind).kv_cache_dtypes
    return ", ".join(sorted(d.value for d in dtypes)) or "nothing"


def _cannot_store(s: Situation, kind: BackendKind) -> str:
    return (
        f"{kind.value} cannot store kv_cache_dtype {_kv_cache_dtype(s).value} "
        f"(it stores {_stored_dtypes(s, kind)})"
    )


def _explicit_backend(s: Situation) -> BackendIntent | None:
    """The backend the operator named (`flash`, `torch`); None when the intent is `auto`."""
    if s.config is None or s.config.backend is BackendIntent.AUTO:
        return None
    return s.config.backend


def _device_map_mixed(s: Situation) -> Reason | None:
    if not s.capability.mixed_device_map:
        return None
    kinds = " and ".join(sorted(d.value for d in s.capability.devices))
    return Reason(
        ReasonCode.DEVICE_MAP_MIXED,
        f"the device map places layers on {kinds}; the paged KV cache must live on one device",
    )


def _model_has_no_kv_cache(s: Situation) -> Reason | None:
    if s.capability.model.has_kv_cache:
        return None
    return Reason(
        ReasonCode.MODEL_HAS_NO_KV_CACHE,
        f"the model ({s.capability.model.architecture}) has no KV cache to page",
    )


def _kv_cache_disabled(s: Situation) -> Reason | None:
    if not s.capability.no_kv_cache:
        return None
    return Reason(
        ReasonCode.KV_CACHE_DISABLED,
        "the worker runs in no_kv_cache debug mode (no KV cache at all)",
    )


def _no_paged_backend(s: Situation) -> Reason | None:
    if _available_candidates(s):
        return None
    why = "; ".join(f"{k.value}: {s.capability.backend(k).reason}" for k in _candidates(s))
    asked = _explicit_backend(s)
    if asked is not None:
        message = (
            f"attention_backend '{asked.value}' was requested, but it is not available ({why})"
        )
    else:
        message = f"no paged attention backend is available ({why})"
    return Reason(ReasonCode.BACKEND_UNAVAILABLE, message)


def _kv_cache_dtype_unsupported(s: Situation) -> Reason | None:
    if _usable_candidates(s):
        return None
    available = _available_candidates(s)
    asked = _explicit_backend(s)
    if asked is not None:
        why = "; ".join(_cannot_store(s, k) for k in available)
        message = f"attention_backend '{asked.value}' was requested, but {why}"
    else:
        stores = "; ".join(f"{k.value} stores {_stored_dtypes(s, k)}" for k in available)
        dtype = _kv_cache_dtype(s).value
        message = f"kv_cache_dtype '{dtype}' cannot be stored by the paged backend ({stores})"
    return Reason(ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED, message)


def _auto_not_enabled_on_device(s: Situation) -> Reason | None:
    if s.capability.device_kind in s.auto_devices:
        return None
    where = ", ".join(sorted(d.value for d in s.auto_devices)) or "no device"
    return Reason(
        ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE,
        f"'auto' enables it on {where} only and this worker is {s.capability.device_kind.value} "
        "(use 'on' to require it, or list the device in auto_enabled_devices)",
    )


def _paged_cache_not_enabled(s: Situation) -> Reason | None:
    if s.paged is not None and s.paged.enabled:
        return None
    why = s.paged.reason.code.value if s.paged is not None else "paged_attention is off"
    return Reason(
        ReasonCode.PAGED_CACHE_NOT_ENABLED,
        f"prefix caching needs the paged KV cache, which is not enabled here ({why})",
    )


@dataclass(frozen=True)
class FeatureRules:
    checks: tuple[Check, ...]  # block the feature in every mode
    auto_checks: tuple[Check, ...] = ()  # only keep `auto` from enabling it


RULES: dict[Feature, FeatureRules] = {
    Feature.PAGED_ATTENTION: FeatureRules(
        checks=(
            _device_map_mixed,
            _model_has_no_kv_cache,
            _kv_cache_disabled,
            _no_paged_backend,
            _kv_cache_dtype_unsupported,
        ),
        auto_checks=(_auto_not_enabled_on_device,),
    ),
    Feature.PREFIX_CACHING: FeatureRules(checks=(_paged_cache_not_enabled,)),
}


def decide_feature(feature: Feature, mode: Mode, situation: Situation) -> Decision:
    """The one decision procedure every tri-state feature goes through."""
    if mode is Mode.OFF:
        return Decision(
            feature, mode, False, False, Reason(ReasonCode.MODE_OFF, f"{feature.value} is 'off'")
        )
    rules = RULES[feature]
    checks = rules.checks + (rules.auto_checks if mode is Mode.AUTO else ())
    for check in checks:
        reason = check(situation)
        if reason is not None:
            return Decision(feature, mode, False, mode is Mode.ON, reason)
    return Decision(
        feature,
        mode,
        True,
        mode is Mode.ON,
        Reason(ReasonCode.ENABLED, f"{feature.value} is supported on this worker"),
    )


def decide_paged_attention(
    config: PagedAttentionConfig | None,
    capability: Capability,
    auto_devices: frozenset[DeviceKind] = DEFAULT_AUTO_DEVICES,
) -> Decision:
    situation = Situation(config, capability, auto_devices)
    return decide_feature(Feature.PAGED_ATTENTION, mode_of(config), situation)


def decide_prefix_caching(
    config: PagedAttentionConfig | None, capability: Capability, paged: Decision
) -> Decision:
    mode = config.prefix_caching if config is not None else Mode.OFF
    situation = Situation(config, capability, frozenset(), paged=paged)
    return decide_feature(Feature.PREFIX_CACHING, mode, situation)


@dataclass(frozen=True)
class BackendChoice:
    kind: BackendKind
    reason: Reason | None = None  # set when `auto` had to settle for a lesser backend
    # Set when an explicitly named backend does not import or cannot store the kv_cache_dtype.
    rejection: Reason | None = None


def _skipped_because(s: Situation, kind: BackendKind) -> str:
    status = s.capability.backend(kind)
    return f"{kind.value}: {status.reason}" if not status.available else _cannot_store(s, kind)


def choose_backend(
    config: PagedAttentionConfig | None, capability: Capability, paged: Decision
) -> BackendChoice:
    """The attention backend a worker should build: the best available paged one that can store
    the requested kv_cache_dtype, or contiguous.

    A backend named explicitly (`flash`, `torch`) is a requirement of its own: where it is not
    available, or cannot store the kv_cache_dtype, the worker is rejected, whatever the paged
    attention mode says.
    """
    situation = Situation(config, capability, frozenset())
    if _explicit_backend(situation) is not None:
        rejection = _no_paged_backend(situation) or _kv_cache_dtype_unsupported(situation)
        if rejection is not None:
            return BackendChoice(BackendKind.CONTIGUOUS, rejection=rejection)
    if not paged.enabled:
        return BackendChoice(BackendKind.CONTIGUOUS)
    candidates = _candidates(situation)
    chosen = _usable_candidates(situation)[0]  # non-empty: the paged decision checked it
    skipped = candidates[: candidates.index(chosen)]
    if not skipped:
        return BackendChoice(chosen)
    why = "; ".join(_skipped_because(situation, k) for k in skipped)
    return BackendChoice(
        chosen, Reason(ReasonCode.BACKEND_FALLBACK, f"using {chosen.value} because {why}")
    )
