"""Checkpoint 3, the realized-state guard: what was requested versus what the engine really built.

The worker calls `select_scheduler` once its cache exists; the controller calls `check_realized`
on the worker's report before counting it as ready. It is the final backstop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from intentserve.policy.capability import BackendKind
from intentserve.policy.config import PagedAttentionConfig
from intentserve.policy.errors import PolicyViolationError
from intentserve.policy.modes import BackendIntent, Mode, WeightFormat
from intentserve.policy.reasons import Reason, ReasonCode


class CacheKind(enum.Enum):
    PAGED = "paged"  # a block pool with block tables
    CONTIGUOUS = "contiguous"  # one max-length slot per sequence
    NONE = "none"  # no KV cache at all (recompute every step)


class SchedulerKind(enum.Enum):
    PAGED = "paged"  # continuous batching over the block pool
    DEFAULT = "default"  # fixed slots over the contiguous cache


_BACKEND_FOR_INTENT = {
    BackendIntent.FLASH: BackendKind.FLASH_PAGED,
    BackendIntent.TRITON: BackendKind.TRITON_PAGED,
    BackendIntent.TORCH: BackendKind.TORCH_PAGED,
}


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers a thinking model's reasoning is between, as the worker found them in its chat
    template and vocabulary; `opened_by_template`: the template's generation prompt opens the
    thinking itself (the start marker is in the prompt, so a reply begins inside it)."""

    start: str
    end: str
    opened_by_template: bool = False

    def describe(self) -> str:
        opened = ", opened by the template" if self.opened_by_template else ""
        return f"reasoning between {self.start} and {self.end}{opened}"


@dataclass(frozen=True)
class RealizedCache:
    """What a loaded engine really built; the worker reports it and the controller verifies it."""

    kind: CacheKind
    backend: BackendKind = BackendKind.CONTIGUOUS
    prefix_caching: bool = False
    block_size: int = 0
    num_blocks: int = 0
    kv_cache_bytes: int = 0
    # Sequence slots: how many sequences the scheduler runs at once (a paged pool's free blocks
    # may run fewer); the controller admits this many requests to the worker at a time.
    max_num_seqs: int = 0
    kv_cache_dtype: str = ""
    scheduler: SchedulerKind | None = None  # None until the guard has selected one
    fallback_reasons: tuple[Reason, ...] = ()
    dtype: str = ""  # model compute dtype
    max_model_len: int = 0  # longest sequence (prompt + output) the engine accepts
    # How the projection weights are held, and their resident bytes (embedding table included).
    weight_format: WeightFormat = WeightFormat.DEQUANTIZED
    weight_bytes: int = 0
    # Banded attention: tokens in the band and how many layers use it (0, 0: none). NOTE: it is
    # realized as a mask; every layer still keeps K/V blocks for the whole sequence.
    sliding_window: int = 0
    num_windowed_layers: int = 0
    # What computes attention, and decode steps captured as CUDA graphs: facts of the build,
    # reported for operators; the policy does not read them ("": not reported / none).
    attention_kernel: str = ""
    decode_graphs: str = ""
    # The ISA variant of the CPU kernels the worker loaded (e.g. "avx512"; "": none).
    kernel_variant: str = ""
    # weights: native: the GGUF tensors held per type, and those dequantized, in words ("": another
    # format).
    weights_held: str = ""
    # Tokens per streamed message after a request's first (the worker's `streamInterval`; 0: a
    # worker that does not report it).
    stream_interval: int = 0
    # What it serves: "generate" (a decoder: Generate) or "embed" (an encoder: Embed, with
    # vectors of `embedding_dim` values).
    task: str = "generate"
    embedding_dim: int = 0
    # A thinking model's reasoning markers (its replies' reasoning is told apart from their
    # text, and a thinking budget is honoured); None: the model does not think.
    reasoning: ReasoningFormat | None = None

    def describe_stream(self) -> str:
        """Tokens per streamed message, in words ("" when not reported)."""
        n = self.stream_interval
        return f"{n} token{'s' * (n > 1)} per streamed message" if n else ""

    def describe_slots(self) -> str:
        """The sequence slots, and how many sequences of max length the cache holds, in words."""
        slots = f"{self.max_num_seqs} sequence slots"
        if not (self.block_size and self.max_model_len):
            return slots
        num_full = self.num_blocks // -(-self.max_model_len // self.block_size)
        return f"{slots} ({num_full} at max length)"

    def describe_window(self) -> str:
        """How the model's sliding window is realized, in words ("" when it has none)."""
        if not self.sliding_window:
            return ""
        return (
            f"sliding window {self.sliding_window} tokens on {self.num_windowed_layers} layers, "
            "masked in attention (every layer keeps its blocks for the whole sequence)"
        )


@dataclass(frozen=True)
class SchedulerIntent:
    """The scheduler settings of the manifest a worker must report realized as written; None:
    not the controller's to check (a controller run on its own, workers started elsewhere; or
    `maxModelLen` not written, so the model's own, capped, is the worker's choice)."""

    stream_interval: int | None = None
    max_model_len: int | None = None

    @property
    def checks_any(self) -> bool:
        """Whether any setting is the controller's to check."""
        return self.stream_interval is not None or self.max_model_len is not None

    def describe(self) -> str:
        """The settings checked, as the manifest names them, and that each worker must report
        them ("" when none is checked)."""
        named = (("streamInterval", self.stream_interval), ("maxModelLen", self.max_model_len))
        said = [f"{name} {value}" for name, value in named if value is not None]
        them = "them" if len(said) > 1 else "it"
        return f"{', '.join(said)} (each worker must report {them})" if said else ""


def check_scheduler(intent: SchedulerIntent, realized: RealizedCache) -> Reason | None:
    """The violation, if the worker serves with other scheduler settings than the manifest's."""
    wanted, got = intent.stream_interval, realized.stream_interval
    if wanted is not None and got != wanted:
        serves = f"sends {realized.describe_stream()}" if got else "does not report one"
        return Reason(
            ReasonCode.SCHEDULER_SETTING_MISMATCH,
            f"spec.scheduler.streamInterval is {wanted}, but the worker {serves}",
        )
    wanted, got = intent.max_model_len, realized.max_model_len
    if wanted is not None and got != wanted:
        return Reason(
            ReasonCode.SCHEDULER_SETTING_MISMATCH,
            f"spec.scheduler.maxModelLen is {wanted}, but the worker serves sequences of up to "
            f"{got} tokens",
        )
    return None


@dataclass(frozen=True)
class SchedulerChoice:
    kind: SchedulerKind
    reason: Reason | None = None  # why the default scheduler runs, when it does


def check_realized(
    requested: PagedAttentionConfig | None, realized: RealizedCache
) -> Reason | None:
    """The violation, if what was realized contradicts the request; None when it conforms."""
    paged = realized.kind is CacheKind.PAGED
    if requested is None:
        if paged:
            return Reason(
                ReasonCode.PAGED_REALIZED_WHILE_OFF,
                "paged_attention is 'off', but the worker realized a paged KV cache",
            )
        return None
    if requested.required and not paged:
        return Reason(
            ReasonCode.PAGED_REQUIRED_NOT_REALIZED,
            f"{requested.describe()} requires a paged KV cache, but the worker realized "
            f"a {realized.kind.value} cache",
        )
    if not paged and not realized.fallback_reasons:
        return Reason(
            ReasonCode.FALLBACK_WITHOUT_REASON,
            "paged_attention 'auto' fell back to a "
            f"{realized.kind.value} cache without recording why",
        )
    if requested.prefix_caching is Mode.ON and not realized.prefix_caching:
        return Reason(
            ReasonCode.PREFIX_CACHING_NOT_REALIZED,
            "prefix_caching is 'on', but the worker's cache does not cache prefixes",
        )
    if requested.prefix_caching is Mode.OFF and realized.prefix_caching:
        return Reason(
            ReasonCode.PREFIX_CACHING_REALIZED_WHILE_OFF,
            "prefix_caching is 'off', but the worker's cache caches prefixes",
        )
    wanted = _BACKEND_FOR_INTENT.get(requested.backend)
    if paged and wanted is not None and realized.backend is not wanted:
        return Reason(
            ReasonCode.BACKEND_MISMATCH,
            f"attention_backend '{requested.backend.value}' was requested, but the worker "
            f"runs {realized.backend.value}",
        )
    return None


def _expected_scheduler(realized: RealizedCache) -> SchedulerKind:
    return SchedulerKind.PAGED if realized.kind is CacheKind.PAGED else SchedulerKind.DEFAULT


def select_scheduler(
    requested: PagedAttentionConfig | None, realized: RealizedCache
) -> SchedulerChoice:
    """Realized paged cache -> PAGED; none and not required -> DEFAULT (with why); else an error."""
    violation = check_realized(requested, realized)
    if violation is not None:
        raise PolicyViolationError(violation)
    if realized.kind is CacheKind.PAGED:
        return SchedulerChoice(SchedulerKind.PAGED)
    why = (
        realized.fallback_reasons[0]
        if realized.fallback_reasons
        else Reason(ReasonCode.MODE_OFF, "paged_attention is 'off'")
    )
    return SchedulerChoice(SchedulerKind.DEFAULT, why)


def verify_report(requested: PagedAttentionConfig | None, realized: RealizedCache) -> Reason | None:
    """The controller's repeat of the guard: the cache check plus the scheduler the worker chose."""
    violation = check_realized(requested, realized)
    if violation is not None:
        return violation
    expected = _expected_scheduler(realized)
    if realized.scheduler is not expected:
        got = realized.scheduler.value if realized.scheduler is not None else "none"
        return Reason(
            ReasonCode.SCHEDULER_MISMATCH,
            f"a {realized.kind.value} cache needs the {expected.value} scheduler, "
            f"but the worker runs {got}",
        )
    return None
