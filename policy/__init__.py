"""Pure policy decisions: intents, capability -> decision, the fallback helper, the scheduler guard
and the readiness verdict. Imports no grpc, torch or ray, and performs no I/O."""

from intentserve.policy.budget import KV_MEMORY_FORMS, KvBudget, parse_kv_memory
from intentserve.policy.capability import (
    BackendKind,
    BackendStatus,
    Capability,
    DeviceKind,
    ModelFacts,
    WeightFormatStatus,
)
from intentserve.policy.config import (
    DEFAULT_BLOCK_SIZE,
    PagedAttentionConfig,
    mode_of,
    paged_attention_config,
    paged_attention_intent,
)
from intentserve.policy.decide import (
    DEFAULT_AUTO_DEVICES,
    RULES,
    BackendChoice,
    Decision,
    Feature,
    choose_backend,
    decide_feature,
    decide_paged_attention,
    decide_prefix_caching,
)
from intentserve.policy.errors import (
    IntentError,
    PagedAttentionRequiredError,
    PolicyError,
    PolicyViolationError,
)
from intentserve.policy.fallback import disable_paged_attention
from intentserve.policy.guard import (
    CacheKind,
    RealizedCache,
    ReasoningFormat,
    SchedulerChoice,
    SchedulerIntent,
    SchedulerKind,
    check_realized,
    check_scheduler,
    select_scheduler,
    verify_report,
)
from intentserve.policy.modes import (
    BackendIntent,
    KvCacheDtype,
    Mode,
    PagedAttentionMode,
    PrefixCachingMode,
    WeightFormat,
)
from intentserve.policy.plausibility import check_plausible
from intentserve.policy.readiness import Availability, Verdict, WorkerReport, readiness
from intentserve.policy.reasons import Reason, ReasonCode
from intentserve.policy.resolution import Resolution, resolve
from intentserve.policy.weights import (
    AUTO_WEIGHT_FORMAT,
    WeightChoice,
    check_weight_format,
    choose_weight_format,
)

__all__ = [
    "AUTO_WEIGHT_FORMAT",
    "DEFAULT_AUTO_DEVICES",
    "DEFAULT_BLOCK_SIZE",
    "KV_MEMORY_FORMS",
    "RULES",
    "Availability",
    "BackendChoice",
    "BackendIntent",
    "BackendKind",
    "BackendStatus",
    "CacheKind",
    "Capability",
    "Decision",
    "DeviceKind",
    "Feature",
    "IntentError",
    "KvBudget",
    "KvCacheDtype",
    "Mode",
    "ModelFacts",
    "PagedAttentionConfig",
    "PagedAttentionMode",
    "PagedAttentionRequiredError",
    "PolicyError",
    "PolicyViolationError",
    "PrefixCachingMode",
    "RealizedCache",
    "ReasoningFormat",
    "Reason",
    "ReasonCode",
    "Resolution",
    "SchedulerChoice",
    "SchedulerIntent",
    "SchedulerKind",
    "Verdict",
    "WeightChoice",
    "WeightFormat",
    "WeightFormatStatus",
    "WorkerReport",
    "check_plausible",
    "check_realized",
    "check_scheduler",
    "check_weight_format",
    "choose_weight_format",
    "choose_backend",
    "decide_feature",
    "decide_paged_attention",
    "decide_prefix_caching",
    "disable_paged_attention",
    "mode_of",
    "paged_attention_config",
    "paged_attention_intent",
    "parse_kv_memory",
    "readiness",
    "resolve",
    "select_scheduler",
    "verify_report",
]
