"""The weight format intent (`spec.model.weights`): resolved against a worker's capability, and
checked again on what the worker reports it holds.

    explicit (dequantized, int8,        realized as asked, or the worker is rejected
              int4, w8a8, native)       (`weight_format_unavailable`); never a silent fallback
    auto                                the rule below; the choice and why travel to the worker,
                                        its realized report and `explain`

The rule for `auto` (measured with bench/weights.py; numbers in docs/engine.md): on this
project's CPUs torch's int8/int4 matmuls beat the oneDNN-packed bf16 projections only while a
step has a few rows (one to eight sequences decoding) and lose from about sixteen rows on, where
a serving worker spends its time. w8a8 (int8 activations as well, int8 dot products) is faster
than dequantized at every batch size on CPUs with VNNI, but it changes the activations'
numerics (SmolLM2's perplexity +2.3%). So `auto` keeps the weights dequantized on every device; a
deployment that wants the memory (SmolLM2: 313 MiB dequantized bf16, 185 int8, 146 int4, 186
w8a8, 92 native) or the speed names the format.

native keeps a GGUF file's own blocks (worker/model/native_weights.py): the device check is here
(a CPU worker whose GGUF kernel builds and passes its self-test); whether the model can be held
(a .gguf file, with at least one projection of a type the kernel reads) is known only once it
is loaded, so the worker refuses it there, with the same reason code, naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.policy.capability import Capability
from intentserve.policy.modes import WeightFormat
from intentserve.policy.reasons import Reason, ReasonCode

AUTO_WEIGHT_FORMAT = WeightFormat.DEQUANTIZED

_AUTO_WHY = (
    "auto keeps the weights dequantized: the int8/int4 matmuls are faster only for steps of a "
    "few rows and slower for batches, and w8a8, faster at every size, also quantizes the "
    "activations (bench/weights.py); ask for int8, int4 or w8a8 to make that trade"
)


@dataclass(frozen=True)
class WeightChoice:
    """The format a worker must hold its weights in; `format` is never AUTO."""

    intent: WeightFormat
    format: WeightFormat
    reason: Reason  # what was chosen and why
    rejection: Reason | None = None  # an explicit format this worker cannot hold

    def describe(self) -> str:
        if self.rejection is not None:
            return f"weights ({self.intent.value}): REJECTED - {self.rejection.message}"
        return f"weights ({self.intent.value}): {self.format.value} - {self.reason.message}"


def choose_weight_format(intent: WeightFormat, capability: Capability) -> WeightChoice:
    if intent is WeightFormat.AUTO:
        return WeightChoice(
            intent, AUTO_WEIGHT_FORMAT, Reason(ReasonCode.WEIGHT_FORMAT_AUTO, _AUTO_WHY)
        )
    status = capability.weight_format(intent)
    if not status.available:
        rejection = Reason(
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            f"this {capability.device_kind.value} worker cannot hold weights '{intent.value}' "
            f"({status.reason})",
        )
        return WeightChoice(intent, intent, rejection, rejection)
    return WeightChoice(
        intent, intent, Reason(ReasonCode.ENABLED, f"weights held as {intent.value}, as requested")
    )


DEFAULT_WEIGHT_CHOICE = WeightChoice(
    WeightFormat.AUTO, AUTO_WEIGHT_FORMAT, Reason(ReasonCode.WEIGHT_FORMAT_AUTO, _AUTO_WHY)
)


def check_weight_format(choice: WeightChoice, realized: WeightFormat) -> Reason | None:
    """The guard: a worker holding another format than the one resolved for it is a violation,
    explicit or auto alike (auto's choice was made by the controller, not by the worker)."""
    if realized is choice.format:
        return None
    return Reason(
        ReasonCode.WEIGHT_FORMAT_MISMATCH,
        f"weights '{choice.intent.value}' resolved to {choice.format.value}, but the worker "
        f"holds {realized.value}",
    )
