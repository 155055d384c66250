"""Reasons are values: a stable machine code plus a sentence for people.

They travel in capability reports, decisions, realized reports, startup errors and `explain`.
The code is what scripts match on; the sentence is what an operator reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ReasonCode(enum.Enum):
    # Decisions at the device/build boundary.
    ENABLED = "enabled"
    MODE_OFF = "mode_off"
    AUTO_NOT_ENABLED_ON_DEVICE = "auto_not_enabled_on_device"
    DEVICE_MAP_MIXED = "device_map_mixed"
    MODEL_HAS_NO_KV_CACHE = "model_has_no_kv_cache"
    KV_CACHE_DISABLED = "kv_cache_disabled"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_FALLBACK = "backend_fallback"
    KV_CACHE_DTYPE_UNSUPPORTED = "kv_cache_dtype_unsupported"
    PAGED_CACHE_NOT_ENABLED = "paged_cache_not_enabled"
    WEIGHT_FORMAT_AUTO = "weight_format_auto"
    WEIGHT_FORMAT_UNAVAILABLE = "weight_format_unavailable"
    # Found while loading (reported by the worker).
    KV_BUDGET_TOO_SMALL = "kv_budget_too_small"
    KV_BUDGET_TOO_LARGE = "kv_budget_too_large"
    LOAD_FAILED = "load_failed"
    # Realized-state guard.
    PAGED_REQUIRED_NOT_REALIZED = "paged_required_not_realized"
    PAGED_REALIZED_WHILE_OFF = "paged_realized_while_off"
    PREFIX_CACHING_NOT_REALIZED = "prefix_caching_not_realized"
    PREFIX_CACHING_REALIZED_WHILE_OFF = "prefix_caching_realized_while_off"
    BACKEND_MISMATCH = "backend_mismatch"
    SCHEDULER_MISMATCH = "scheduler_mismatch"
    FALLBACK_WITHOUT_REASON = "fallback_without_reason"
    WEIGHT_FORMAT_MISMATCH = "weight_format_mismatch"
    SCHEDULER_SETTING_MISMATCH = "scheduler_setting_mismatch"
    # A realized report that cannot be true against the worker's capability and the budget.
    REALIZED_REPORT_IMPLAUSIBLE = "realized_report_implausible"
    # Deployment readiness.
    READY = "ready"
    DEGRADED = "degraded"  # ready, while some worker is suspect, lost or dead
    WORKER_PENDING = "worker_pending"
    WORKER_NOT_SERVING = "worker_not_serving"
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"
    POLICY_VIOLATION = "policy_violation"
    # A separate router's own view of its worker table.
    CONTROLLER_UNREACHABLE = "controller_unreachable"


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"
