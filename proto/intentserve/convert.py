"""The one place where policy values and protobuf messages meet (both directions).

Worker and controller both speak the contract through these functions; the rest of the code
handles plain `policy` dataclasses and never touches `*_pb2` for them.
"""

from __future__ import annotations

import enum

from intentserve.policy import (
    BackendChoice,
    BackendIntent,
    BackendKind,
    BackendStatus,
    CacheKind,
    Capability,
    Decision,
    DeviceKind,
    Feature,
    KvBudget,
    KvCacheDtype,
    Mode,
    ModelFacts,
    PagedAttentionConfig,
    RealizedCache,
    Reason,
    ReasonCode,
    ReasoningFormat,
    Resolution,
    SchedulerKind,
    WeightChoice,
    WeightFormat,
    WeightFormatStatus,
    paged_attention_intent,
)
from intentserve.v1 import common_pb2 as pb


def _enum_to_pb(value: enum.Enum, pb_enum) -> int:
    """`Mode.AUTO` -> `MODE_AUTO`: the protobuf enum name is the prefix plus the member name."""
    prefix = pb_enum.DESCRIPTOR.values[0].name.removesuffix("UNSPECIFIED")
    return pb_enum.Value(prefix + value.name)


def _enum_from_pb(number: int, pb_enum, py_enum: type[enum.Enum], field: str):
    prefix = pb_enum.DESCRIPTOR.values[0].name.removesuffix("UNSPECIFIED")
    name = pb_enum.Name(number)
    if number == 0 or not name.startswith(prefix) or name[len(prefix) :] not in py_enum.__members__:
        raise ValueError(f"{field}: {name} is not a valid value")
    return py_enum[name[len(prefix) :]]


def reason_to_pb(reason: Reason) -> pb.Reason:
    return pb.Reason(code=reason.code.value, message=reason.message)


def reason_from_pb(msg: pb.Reason) -> Reason:
    try:
        code = ReasonCode(msg.code)
    except ValueError:
        raise ValueError(f"reason.code: unknown reason code {msg.code!r}") from None
    return Reason(code, msg.message)


def policy_to_pb(config: PagedAttentionConfig | None) -> pb.PagedAttentionPolicy:
    if config is None:
        return pb.PagedAttentionPolicy(mode=pb.MODE_OFF, prefix_caching=pb.MODE_OFF)
    return pb.PagedAttentionPolicy(
        mode=_enum_to_pb(config.mode, pb.Mode),
        block_size=config.block_size,
        prefix_caching=_enum_to_pb(config.prefix_caching, pb.Mode),
        backend=_enum_to_pb(config.backend, pb.BackendIntent),
        kv_cache_dtype=_enum_to_pb(config.kv_cache_dtype, pb.KvCacheDtype),
    )


def _optional_enum(number: int, pb_enum, py_enum: type[enum.Enum], field: str):
    """An unset optional intent is "not given" (None), so a hand-written request stays short."""
    return None if number == 0 else _enum_from_pb(number, pb_enum, py_enum, field)


def policy_from_pb(msg: pb.PagedAttentionPolicy) -> PagedAttentionConfig | None:
    """The policy as typed values; an unset option is "not given" (its default applies)."""
    mode = _enum_from_pb(msg.mode, pb.Mode, Mode, "policy.mode")
    prefix = _optional_enum(msg.prefix_caching, pb.Mode, Mode, "policy.prefix_caching")
    if mode is Mode.OFF:
        return paged_attention_intent(mode, prefix_caching=prefix)
    return paged_attention_intent(
        mode,
        block_size=msg.block_size or None,
        prefix_caching=prefix,
        backend=_optional_enum(msg.backend, pb.BackendIntent, BackendIntent, "policy.backend"),
        kv_cache_dtype=_optional_enum(
            msg.kv_cache_dtype, pb.KvCacheDtype, KvCacheDtype, "policy.kv_cache_dtype"
        ),
    )


def kv_budget_to_pb(budget: KvBudget) -> pb.KvBudget:
    return pb.KvBudget(num_bytes=budget.num_bytes or 0, fraction=budget.fraction or 0.0)


def kv_budget_from_pb(msg: pb.KvBudget) -> KvBudget:
    return KvBudget(num_bytes=msg.num_bytes or None, fraction=msg.fraction or None)


def weight_format_to_pb(fmt: WeightFormat) -> int:
    return _enum_to_pb(fmt, pb.WeightFormat)


def weight_format_from_pb(number: int, field: str, *, unspecified: WeightFormat) -> WeightFormat:
    """`unspecified` is what a peer that predates the field meant."""
    return (
        unspecified if number == 0 else _enum_from_pb(number, pb.WeightFormat, WeightFormat, field)
    )


def device_kind_to_pb(kind: DeviceKind) -> int:
    return _enum_to_pb(kind, pb.DeviceKind)


def capability_to_pb(cap: Capability) -> pb.Capability:
    return pb.Capability(
        device_kind=_enum_to_pb(cap.device_kind, pb.DeviceKind),
        model=pb.ModelFacts(
            architecture=cap.model.architecture,
            has_kv_cache=cap.model.has_kv_cache,
            head_dim=cap.model.head_dim,
            num_layers=cap.model.num_layers,
            num_kv_heads=cap.model.num_kv_heads,
            max_model_len=cap.model.max_model_len,
        ),
        backends=[
            pb.BackendStatus(
                kind=_enum_to_pb(b.kind, pb.BackendKind),
                available=b.available,
                reason=b.reason,
                kv_cache_dtypes=sorted(_enum_to_pb(d, pb.KvCacheDtype) for d in b.kv_cache_dtypes),
            )
            for b in cap.backends
        ],
        layer_devices=[_enum_to_pb(d, pb.DeviceKind) for d in cap.layer_devices],
        total_memory_bytes=cap.total_memory_bytes,
        free_memory_bytes=cap.free_memory_bytes,
        torch_version=cap.torch_version,
        cuda_version=cap.cuda_version,
        no_kv_cache=cap.no_kv_cache,
        weight_formats=[
            pb.WeightFormatStatus(
                format=weight_format_to_pb(w.format), available=w.available, reason=w.reason
            )
            for w in cap.weight_formats
        ],
    )


def capability_from_pb(msg: pb.Capability) -> Capability:
    m = msg.model
    return Capability(
        device_kind=_enum_from_pb(msg.device_kind, pb.DeviceKind, DeviceKind, "device_kind"),
        model=ModelFacts(
            architecture=m.architecture,
            has_kv_cache=m.has_kv_cache,
            head_dim=m.head_dim,
            num_layers=m.num_layers,
            num_kv_heads=m.num_kv_heads,
            max_model_len=m.max_model_len,
        ),
        backends=tuple(
            BackendStatus(
                kind=_enum_from_pb(b.kind, pb.BackendKind, BackendKind, "backends.kind"),
                available=b.available,
                reason=b.reason,
                kv_cache_dtypes=frozenset(
                    _enum_from_pb(d, pb.KvCacheDtype, KvCacheDtype, "backends.kv_cache_dtypes")
                    for d in b.kv_cache_dtypes
                ),
            )
            for b in msg.backends
        ),
        layer_devices=tuple(
            _enum_from_pb(d, pb.DeviceKind, DeviceKind, "layer_devices") for d in msg.layer_devices
        ),
        total_memory_bytes=msg.total_memory_bytes,
        free_memory_bytes=msg.free_memory_bytes,
        torch_version=msg.torch_version,
        cuda_version=msg.cuda_version,
        no_kv_cache=msg.no_kv_cache,
        weight_formats=tuple(
            WeightFormatStatus(
                _enum_from_pb(w.format, pb.WeightFormat, WeightFormat, "weight_formats.format"),
                w.available,
                w.reason,
            )
            for w in msg.weight_formats
        ),
    )


def decision_to_pb(decision: Decision) -> pb.Decision:
    return pb.Decision(
        feature=decision.feature.value,
        mode=_enum_to_pb(decision.mode, pb.Mode),
        enabled=decision.enabled,
        required=decision.required,
        reason=reason_to_pb(decision.reason),
    )


def decision_from_pb(msg: pb.Decision) -> Decision:
    return Decision(
        feature=Feature(msg.feature),
        mode=_enum_from_pb(msg.mode, pb.Mode, Mode, "decision.mode"),
        enabled=msg.enabled,
        required=msg.required,
        reason=reason_from_pb(msg.reason),
    )


def realized_to_pb(realized: RealizedCache) -> pb.RealizedState:
    return pb.RealizedState(
        cache_kind=_enum_to_pb(realized.kind, pb.CacheKind),
        backend=_enum_to_pb(realized.backend, pb.BackendKind),
        prefix_caching=realized.prefix_caching,
        block_size=realized.block_size,
        num_blocks=realized.num_blocks,
        kv_cache_bytes=realized.kv_cache_bytes,
        max_num_seqs=realized.max_num_seqs,
        kv_cache_dtype=realized.kv_cache_dtype,
        scheduler=_enum_to_pb(realized.scheduler, pb.SchedulerKind) if realized.scheduler else 0,
        fallback_reasons=[reason_to_pb(r) for r in realized.fallback_reasons],
        dtype=realized.dtype,
        max_model_len=realized.max_model_len,
        weight_format=weight_format_to_pb(realized.weight_format),
        weight_bytes=realized.weight_bytes,
        sliding_window=realized.sliding_window,
        num_windowed_layers=realized.num_windowed_layers,
        stream_interval=realized.stream_interval,
        attention_kernel=realized.attention_kernel,
        decode_graphs=realized.decode_graphs,
        kernel_variant=realized.kernel_variant,
        weights_held=realized.weights_held,
        task=realized.task,
        embedding_dim=realized.embedding_dim,
        reasoning=_reasoning_to_pb(realized.reasoning),
    )


def realized_from_pb(msg: pb.RealizedState) -> RealizedCache:
    return RealizedCache(
        kind=_enum_from_pb(msg.cache_kind, pb.CacheKind, CacheKind, "realized.cache_kind"),
        backend=_enum_from_pb(msg.backend, pb.BackendKind, BackendKind, "realized.backend"),
        prefix_caching=msg.prefix_caching,
        block_size=msg.block_size,
        num_blocks=msg.num_blocks,
        kv_cache_bytes=msg.kv_cache_bytes,
        max_num_seqs=msg.max_num_seqs,
        kv_cache_dtype=msg.kv_cache_dtype,
        scheduler=(
            _enum_from_pb(msg.scheduler, pb.SchedulerKind, SchedulerKind, "realized.scheduler")
            if msg.scheduler
            else None
        ),
        fallback_reasons=tuple(reason_from_pb(r) for r in msg.fallback_reasons),
        dtype=msg.dtype,
        max_model_len=msg.max_model_len,
        weight_format=weight_format_from_pb(
            msg.weight_format, "realized.weight_format", unspecified=WeightFormat.DEQUANTIZED
        ),
        weight_bytes=msg.weight_bytes,
        sliding_window=msg.sliding_window,
        num_windowed_layers=msg.num_windowed_layers,
        stream_interval=msg.stream_interval,
        attention_kernel=msg.attention_kernel,
        decode_graphs=msg.decode_graphs,
        kernel_variant=msg.kernel_variant,
        weights_held=msg.weights_held,
        task=_task_from_pb(msg.task),
        embedding_dim=msg.embedding_dim,
        reasoning=_reasoning_from_pb(msg),
    )


def _reasoning_to_pb(reasoning: ReasoningFormat | None) -> pb.ReasoningFormat | None:
    if reasoning is None:
        return None
    return pb.ReasoningFormat(
        start=reasoning.start, end=reasoning.end, opened_by_template=reasoning.opened_by_template
    )


def _reasoning_from_pb(msg: pb.RealizedState) -> ReasoningFormat | None:
    if not msg.HasField("reasoning"):
        return None
    if not (msg.reasoning.start and msg.reasoning.end):
        raise ValueError(
            "realized.reasoning: a thinking model's start and end markers are both required"
        )
    r = msg.reasoning
    return ReasoningFormat(r.start, r.end, r.opened_by_template)


TASKS = ("generate", "embed")


def _task_from_pb(task: str) -> str:
    """A worker that predates the report ("") generates; another word is refused by name."""
    if not task:
        return "generate"
    if task not in TASKS:
        raise ValueError(f"realized.task: {task!r} is not one of {', '.join(TASKS)}")
    return task


def resolution_to_pb(
    config: PagedAttentionConfig | None, resolution: Resolution, kv_budget: KvBudget
) -> pb.ResolvedConfig:
    return pb.ResolvedConfig(
        policy=policy_to_pb(config),
        decisions=[decision_to_pb(d) for d in resolution.decisions],
        backend=_enum_to_pb(resolution.backend.kind, pb.BackendKind),
        fallback_reasons=[reason_to_pb(r) for r in resolution.fallback_reasons],
        kv_budget=kv_budget_to_pb(kv_budget),
        weight_intent=weight_format_to_pb(resolution.weights.intent),
        weight_format=weight_format_to_pb(resolution.weights.format),
        weight_reason=reason_to_pb(resolution.weights.reason),
    )


def resolution_from_pb(
    msg: pb.ResolvedConfig,
) -> tuple[PagedAttentionConfig | None, Resolution, KvBudget]:
    """The worker's side: the policy it must keep, the decisions made for it, its KV budget."""
    decisions = {d.feature: d for d in (decision_from_pb(m) for m in msg.decisions)}
    missing = {Feature.PAGED_ATTENTION, Feature.PREFIX_CACHING} - decisions.keys()
    if missing:
        names = ", ".join(sorted(f.value for f in missing))
        raise ValueError(f"resolved_config.decisions: missing {names}")
    kind = _enum_from_pb(msg.backend, pb.BackendKind, BackendKind, "resolved_config.backend")
    fallback = tuple(reason_from_pb(r) for r in msg.fallback_reasons)
    backend_reason = next((r for r in fallback if r.code is ReasonCode.BACKEND_FALLBACK), None)
    resolution = Resolution(
        decisions[Feature.PAGED_ATTENTION],
        decisions[Feature.PREFIX_CACHING],
        BackendChoice(kind, backend_reason),
        _weight_choice_from_pb(msg),
    )
    return policy_from_pb(msg.policy), resolution, kv_budget_from_pb(msg.kv_budget)


def _weight_choice_from_pb(msg: pb.ResolvedConfig) -> WeightChoice:
    """A controller that predates the field resolved nothing: its workers dequantize."""
    if not msg.weight_format:
        return WeightChoice(
            WeightFormat.AUTO,
            WeightFormat.DEQUANTIZED,
            Reason(ReasonCode.WEIGHT_FORMAT_AUTO, "the controller resolved no weight format"),
        )
    chosen = _enum_from_pb(
        msg.weight_format, pb.WeightFormat, WeightFormat, "resolved_config.weight_format"
    )
    if chosen is WeightFormat.AUTO:
        raise ValueError("resolved_config.weight_format: auto is an intent, not a resolved format")
    return WeightChoice(
        weight_format_from_pb(
            msg.weight_intent, "resolved_config.weight_intent", unspecified=WeightFormat.AUTO
        ),
        chosen,
        reason_from_pb(msg.weight_reason),
    )
