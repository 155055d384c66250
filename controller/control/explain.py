"""The policy chain of one worker in words:
intent -> capability -> decision -> realized -> verdict."""

from __future__ import annotations

from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerRecord
from intentserve.controller.control.state import DesiredState, WorkerState
from intentserve.policy import Capability, PagedAttentionConfig, RealizedCache, Resolution, Verdict


def explain(desired: DesiredState, record: WorkerRecord, verdict: Verdict) -> list[str]:
    """One sentence per link of the chain, in order, then the deployment's verdict."""
    intent = [
        describe_intent(desired.policy),
        f"kv budget {desired.kv_budget.describe()}",
        f"weights '{desired.weights.value}'",
    ]
    if scheduler := desired.scheduler.describe():
        intent.append(f"scheduler {scheduler}")
    devices = ", ".join(sorted(d.value for d in desired.auto_devices)) or "no device"
    return [
        f"intent: {'; '.join(intent)}; 'auto' enables it on {devices}",
        f"capability: {_capability(record.capability)}",
        *_decisions(record.resolution),
        f"realized: {describe_realized(record.realized)}",
        f"verdict: {_worker_verdict(record)}",
        f"deployment: {deployment_state(verdict).name} - {verdict.reason}",
    ]


def describe_intent(policy: PagedAttentionConfig | None) -> str:
    if policy is None:
        return "paged_attention 'off' (never attempted; a paged cache would be a violation)"
    return (
        f"paged_attention '{policy.mode.value}' (block_size {policy.block_size}, "
        f"prefix_caching {policy.prefix_caching.value}, "
        f"attention_backend {policy.backend.value}, kv_cache_dtype {policy.kv_cache_dtype.value})"
    )


def _capability(cap: Capability) -> str:
    model = cap.model
    kv = "has a KV cache" if model.has_kv_cache else "has no KV cache"
    formats = ", ".join(
        f"{w.format.value} available"
        if w.available
        else f"{w.format.value} unavailable ({w.reason})"
        for w in cap.weight_formats
    )
    backends = ", ".join(
        f"{b.kind.value} available" if b.available else f"{b.kind.value} unavailable ({b.reason})"
        for b in cap.backends
    )
    notes = []
    if cap.mixed_device_map:
        notes.append("layers on " + " and ".join(sorted(d.value for d in cap.devices)))
    if cap.no_kv_cache:
        notes.append("no_kv_cache debug mode")
    extra = f"; {', '.join(notes)}" if notes else ""
    return (
        f"{cap.device_kind.value} worker, model {model.architecture} ({kv}); "
        f"backends: {backends or 'none reported'}; "
        f"weights: dequantized available, {formats or 'no quantized format reported'}{extra}"
    )


def _decisions(resolution: Resolution | None) -> list[str]:
    if resolution is None:
        return ["decision: not resolved yet"]
    lines = [f"decision: {d.describe()}" for d in resolution.decisions]
    lines.append(f"decision: {resolution.weights.describe()}")
    backend = resolution.backend
    if backend.rejection is not None:
        lines.append(f"decision: attention backend REJECTED - {backend.rejection.message}")
    else:
        why = f" - {backend.reason.message}" if backend.reason is not None else ""
        lines.append(f"decision: attention backend {backend.kind.value}{why}")
    return lines


def describe_realized(realized: RealizedCache | None) -> str:
    if realized is None:
        return "not reported yet"
    parts = [f"{realized.kind.value} cache", f"{realized.backend.value} backend"]
    if realized.task == "embed":
        parts.insert(0, f"task embed ({realized.embedding_dim}-value vectors)")
    if realized.num_blocks:
        parts.append(f"{realized.num_blocks} blocks of {realized.block_size} tokens")
    if realized.kv_cache_bytes:
        parts.append(f"{realized.kv_cache_bytes / 2**20:.1f} MiB of KV")
    if realized.max_num_seqs:
        parts.append(realized.describe_slots())
    parts.append(f"prefix caching {'on' if realized.prefix_caching else 'off'}")
    if realized.reasoning is not None:
        parts.append(realized.reasoning.describe())
    parts.append(
        f"{realized.weight_format.value} weights ({realized.weight_bytes / 2**20:.1f} MiB)"
    )
    scheduler = realized.scheduler.value if realized.scheduler is not None else "no"
    parts.append(f"{scheduler} scheduler")
    if realized.sliding_window:
        parts.append(realized.describe_window())
    if realized.stream_interval:
        parts.append(realized.describe_stream())
    if realized.attention_kernel:
        parts.append(f"attention by {realized.attention_kernel}")
    if realized.decode_graphs:
        parts.append(f"decode steps from {realized.decode_graphs}")
    if realized.kernel_variant:
        parts.append(f"CPU kernels of the {realized.kernel_variant} variant")
    if realized.weights_held:
        parts.append(realized.weights_held)
    text = ", ".join(parts)
    if realized.fallback_reasons:
        text += "; fallbacks: " + "; ".join(str(r) for r in realized.fallback_reasons)
    return text


def _worker_verdict(record: WorkerRecord) -> str:
    state = record.state
    if state is WorkerState.READY:
        return "READY - the realized state conforms to the policy; it receives requests"
    if state is WorkerState.REJECTED:
        if record.resolution is not None and record.resolution.rejection is not None:
            when = "at registration"
        else:
            when = "while loading" if record.realized is None else "after its realized report"
        return f"REJECTED {when} - {record.problem}"
    if state is WorkerState.LOST:
        return f"LOST - {record.problem}; it must register again and be verified from scratch"
    if state is WorkerState.DRAINING:
        return (
            f"DRAINING - receives no new requests ({record.num_outstanding} still running); "
            "a resume takes it back"
        )
    if state is WorkerState.SUSPECT:
        return (
            f"SUSPECT - {record.problem}; it serves again once its connection works and it "
            "heartbeats, else it is lost at the heartbeat timeout"
        )
    return f"{state.name} - waiting for its realized report"
