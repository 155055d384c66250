"""One step that shapes the model the engine runs: the loaded model, the resolved weight choice and
the attention backend in; the model rewritten for this worker out, with what each pass did.

The passes, in order (each rewrites the model's modules in place; the CPU-only ones do nothing on
other devices):
1. weights: held as the resolution says (quantized, or the GGUF file's own blocks); a format that
   cannot be held stops the build with its reason, never a fallback to dequantized;
2. projections: packed for the CPU matmul kernel that runs them, or why torch runs them;
3. the packed weights moved into one mapping on 2 MiB pages, before the compiled step takes their
   addresses;
4. norms and activations: the fused CPU kernels, or why torch runs them; the step's buffers kept;
5. decode layers: every layer of a decode step in one compiled call over the attention backend.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from intentserve.policy import (
    PagedAttentionRequiredError,
    Reason,
    ReasonCode,
    WeightChoice,
    WeightFormat,
)
from intentserve.worker.hugepages import huge_page_bytes, move_weights_to_huge_pages, thp_mode
from intentserve.worker.kernels import gguf_gemm_kernel
from intentserve.worker.model.calibration import CALIBRATION_TEXT
from intentserve.worker.model.cpu_ops import enable_fused_ops, enable_int8_gemm
from intentserve.worker.model.decode_layers import CompiledDecode
from intentserve.worker.model.loaded import LoadedModel
from intentserve.worker.model.native_weights import NativeWeightsError, hold_native
from intentserve.worker.model.packed_linear import prepack_available, prepack_linears
from intentserve.worker.model.quant_linear import WeightShapeError
from intentserve.worker.model.step_buffers import keep_step_buffers
from intentserve.worker.model.weight_format import held_format, quantize_linears

log = logging.getLogger(__name__)

PROJECTIONS = "projections"
NORMS_AND_ACTIVATIONS = "norms and activations"
DECODE_LAYERS = "decode layers"


@dataclass(frozen=True)
class ShapingStep:
    """What one pass did to the model, in words (`what` names the pass)."""

    what: str
    did: str


@dataclass(frozen=True)
class ShapedModel:
    model: torch.nn.Module | None  # the loaded model, rewritten in place (None: not generative)
    steps: tuple[ShapingStep, ...]  # the passes that did something, in order
    holding: str = ""  # native: the tensors held per type, and those dequantized ("": not native)


def shape_model(
    loaded: LoadedModel,
    weights: WeightChoice,
    attention,
    device: torch.device,
    cpu_prepack: bool = True,
) -> ShapedModel:
    """The model the engine runs on `device`, with `weights` held as resolved and the kernels
    wired (`attention`: the KV cache's backend, None without a cache)."""
    holding = _hold_weights(weights, loaded)
    on_cpu = device.type == "cpu" and loaded.model is not None
    steps = []
    if on_cpu:
        projections = "; ".join(filter(None, (_pack_for_cpu(loaded, cpu_prepack), holding)))
        steps.append(ShapingStep(PROJECTIONS, projections))
        _weights_on_huge_pages(loaded)
        steps.append(ShapingStep(NORMS_AND_ACTIVATIONS, enable_fused_ops(loaded.model)))
        keep_step_buffers(loaded.model)
        if attention is not None and hasattr(loaded.model, "compiled_decode"):
            steps.append(ShapingStep(DECODE_LAYERS, _compile_decode(loaded, attention)))
    elif holding:
        steps.append(ShapingStep(PROJECTIONS, holding))
    return ShapedModel(loaded.model, tuple(s for s in steps if s.did), holding)


def held_weight_format(loaded: LoadedModel) -> WeightFormat:
    """How the model's projections are held now (dequantized for a model without them)."""
    return WeightFormat.DEQUANTIZED if loaded.model is None else held_format(loaded.model)


def _hold_weights(choice: WeightChoice, loaded: LoadedModel) -> str:
    """Quantize the projections where the resolution says so (native: keep the file's blocks);
    returns what native holds how, in words ("" otherwise). A format that cannot be realized
    stops the build with its reason: there is no fallback to dequantized."""
    if choice.rejection is not None:
        raise PagedAttentionRequiredError(
            choice.rejection, f"weights: {choice.intent.value}", subject="The weight format"
        )
    if choice.format is WeightFormat.DEQUANTIZED or loaded.model is None:
        return ""
    try:
        if choice.format is WeightFormat.NATIVE:
            holding = hold_native(loaded, gguf_gemm_kernel()).describe()
            log.info("weights held native: %s", holding)
            return holding
        calibration = None
        if choice.format is WeightFormat.W8A8 and loaded.tokenizer is not None:
            calibration = loaded.tokenizer.encode(CALIBRATION_TEXT)
        count = quantize_linears(loaded.model, choice.format, calibration)
    except (WeightShapeError, NativeWeightsError) as error:
        reason = Reason(
            ReasonCode.WEIGHT_FORMAT_UNAVAILABLE,
            f"this model cannot be held as {choice.format.value}: {error}",
        )
        raise PagedAttentionRequiredError(
            reason, f"weights: {choice.intent.value}", subject="The weight format"
        ) from None
    log.info("%d projections held as %s (%s)", count, choice.format.value, choice.reason.message)
    return ""


def _pack_for_cpu(loaded: LoadedModel, cpu_prepack: bool) -> str:
    """The projections' weights packed for the CPU matmul that runs them; says which runs."""
    held = held_weight_format(loaded)
    if held is WeightFormat.W8A8:
        return enable_int8_gemm(loaded.model)
    if held is WeightFormat.NATIVE:
        return f"GGUF block kernel ({gguf_gemm_kernel().isa()})"
    if held is not WeightFormat.DEQUANTIZED:
        return f"torch's {held.value} kernels"
    if not cpu_prepack:
        return "torch F.linear (packing turned off)"
    available, why = prepack_available()
    if not available:
        log.info("projection weights stay unpacked: %s", why)
        return f"torch F.linear ({why})"
    return prepack_linears(loaded.model)


def _weights_on_huge_pages(loaded: LoadedModel) -> None:
    """The packed projection weights moved into one mapping on 2 MiB pages (hugepages.py); logs
    what the kernel granted."""
    moved = move_weights_to_huge_pages(loaded.model)
    if moved:
        first = next(t for name, t in loaded.model.named_buffers() if name.endswith("packed"))
        log.info(
            "%d MiB of packed weights in one mapping, %d MiB of it on 2 MiB pages "
            "(transparent huge pages: %s)",
            moved >> 20,
            huge_page_bytes(first) >> 20,
            thp_mode(),
        )


def _compile_decode(loaded: LoadedModel, attention) -> str:
    """Every layer of a decode step in one compiled call, where the model allows; says which."""
    compiled, why = CompiledDecode.build(loaded.model, attention)
    loaded.model.compiled_decode = compiled
    return "one compiled call per step" if compiled else f"per-layer Python ({why})"
