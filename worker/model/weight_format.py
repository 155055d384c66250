"""Holding a loaded model's weights in the format its resolution chose.

`quantize_linears` replaces the projections (and the LM head) with quantized modules, in place,
like `packed_linear.prepack_linears` packs them; the embedding table stays as loaded (a lookup,
not a matmul).

The LM head is int8 under int4 too. Measured on SmolLM2 (float32, 19 tokens): its projections
come from Q4_1 blocks, which int4 holds exactly (logits identical), but its tied head is the
Q8_0 embedding table, and int4 there moved the logits by up to 4.7 (mean 0.43); int8 there by
0.59 (mean 0.05), at the same single-row speed (~0.38 ms for 49152 x 576) for 14 MB more.

w8a8 holds the head as w8a8 as well, and smooths every projection's inputs first: the ranges
come from one pass over a fixed calibration text (calibration.py), made before quantizing.

`native` (a GGUF file's own blocks) is native_weights.py's; here it is probed and recognized.

`weight_format_statuses` is the capability probe's part: which formats this device and torch
build can run, each checked by a small self-test rather than assumed.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from intentserve.policy import WeightFormat, WeightFormatStatus
from intentserve.worker.kernels import KernelUnavailable, gguf_gemm_kernel
from intentserve.worker.model.calibration import input_ranges
from intentserve.worker.model.gguf_linear import GgufBlocks, NativeLinear
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.quant_linear import (
    GROUP_SIZE,
    INT4_BLOCK_N,
    QUANTIZED,
    W8A8Linear,
    WeightShapeError,
    quantize_int4,
    unpack_int4,
)
from torch import Tensor, nn

# The format the LM head is held in, per format (see above).
HEAD_FORMAT = {
    WeightFormat.INT8: WeightFormat.INT8,
    WeightFormat.INT4: WeightFormat.INT8,
    WeightFormat.W8A8: WeightFormat.W8A8,
}

_KERNELS = {
    WeightFormat.INT8: ("_weight_int8pack_mm",),
    WeightFormat.INT4: ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
    WeightFormat.W8A8: ("_int_mm",),
}


def _self_test(fmt: WeightFormat) -> str:
    """ "" when the format's kernels give the reference answer here, else what went wrong."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(INT4_BLOCK_N * 2, GROUP_SIZE * 4, generator=generator)
    x = torch.randn(3, weight.shape[1], generator=generator)
    if fmt is WeightFormat.W8A8:
        return _w8a8_self_test(weight, x)
    module = QUANTIZED[fmt](weight, None, torch.float32)
    expected = F.linear(x, module.dequantize())
    if fmt is WeightFormat.INT4:
        q = quantize_int4(weight)[0]
        if not torch.equal(unpack_int4(module.packed, *weight.shape).to(torch.int32), q):
            return (
                f"torch's int4 pack layout ({torch.backends.cpu.get_cpu_capability()} kernels) "
                "is not the one intentserve reads"
            )
    got = module(x)
    if not torch.allclose(got, expected, rtol=1e-3, atol=1e-3):
        return f"the {fmt.value} kernel's result differs from the reference"
    return ""


def _w8a8_self_test(weight: Tensor, x: Tensor) -> str:
    """torch._int_mm must give the exact integer products (int64 arithmetic as the reference),
    for one row and for a batch, on the module's own transposed-view layout."""
    module = W8A8Linear(weight, None, torch.float32, x.abs().amax(dim=0))
    for rows in (1, x.shape[0]):
        q = torch.round(x[:rows] * 40).clamp(-127, 127).to(torch.int8)
        got = torch._int_mm(q, module.qweight.t())
        expected = q.long() @ module.qweight.long().t()
        if got.dtype != torch.int32 or not torch.equal(got.long(), expected):
            return f"torch._int_mm's products differ from the exact ones ({rows} rows)"
    return ""


def _status(fmt: WeightFormat, device: torch.device) -> WeightFormatStatus:
    if device.type != "cpu":
        return WeightFormatStatus(
            fmt,
            False,
            f"{fmt.value} weights are implemented for the CPU only (torch's "
            f"{' / '.join(_KERNELS[fmt])}); use dequantized on {device.type}",
        )
    missing = [name for name in _KERNELS[fmt] if not hasattr(torch.ops.aten, name)]
    if missing:
        return WeightFormatStatus(
            fmt, False, f"torch {torch.__version__} has no {', '.join(missing)}"
        )
    try:
        problem = _self_test(fmt)
    except RuntimeError as error:  # a kernel this CPU or build cannot run
        problem = f"the {fmt.value} kernel failed its self-test: {error}"
    return WeightFormatStatus(fmt, not problem, problem)


def _native_status(device: torch.device) -> WeightFormatStatus:
    """native runs on gguf_gemm.c: the CPU, the kernel built, and a Q8_0 matmul that gives the
    dequantized weights' answer (within the activations' int8 rounding)."""
    fmt = WeightFormat.NATIVE
    if device.type != "cpu":
        return WeightFormatStatus(
            fmt,
            False,
            "native weights are implemented for the CPU only (the GGUF kernel, gguf_gemm.c); "
            f"use dequantized on {device.type}",
        )
    try:
        kernel = gguf_gemm_kernel()
    except KernelUnavailable as error:
        return WeightFormatStatus(fmt, False, f"the GGUF kernel is unavailable: {error.reason}")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, GROUP_SIZE * 4, generator=generator)
    x = torch.randn(3, weight.shape[1], generator=generator)
    qtype = gguf.GGMLQuantizationType.Q8_0
    data = torch.from_numpy(gguf.quants.quantize(weight.numpy(), qtype))
    dequantized = torch.from_numpy(np.array(gguf.quants.dequantize(data.numpy(), qtype)))
    got = NativeLinear([GgufBlocks(qtype, data, weight.shape[1])], None, kernel)(x)
    if not torch.allclose(got, F.linear(x, dequantized), rtol=0.05, atol=0.1):
        return WeightFormatStatus(fmt, False, "the GGUF kernel's Q8_0 result differs from gguf's")
    return WeightFormatStatus(fmt, True, "")


def weight_format_statuses(device: torch.device | str) -> tuple[WeightFormatStatus, ...]:
    device = torch.device(device)
    return (*(_status(fmt, device) for fmt in QUANTIZED), _native_status(device))


def _projections(model: LlamaModel) -> list[tuple[nn.Module, str, str]]:
    """(owner, attribute, key) of every projection; the key names it in messages and ranges."""
    owners = []
    for i, layer in enumerate(model.layers):
        owners += [
            (layer.self_attn, "qkv_proj", f"layers.{i}.qkv_proj"),
            (layer.self_attn, "o_proj", f"layers.{i}.o_proj"),
            (layer.mlp, "gate_up_proj", f"layers.{i}.gate_up_proj"),
            (layer.mlp, "down_proj", f"layers.{i}.down_proj"),
        ]
    return owners


def quantize_linears(
    model: LlamaModel, fmt: WeightFormat, calibration_ids: list[int] | None = None
) -> int:
    """Replace every projection and the LM head with `fmt` modules; returns how many.

    A tied LM head gets a quantized copy of the embedding table, which the lookup still needs.
    w8a8 needs `calibration_ids` (the calibration text, tokenized) to smooth with.
    Raises WeightShapeError naming the projection whose shape the format cannot hold.
    """
    cls, head_cls = QUANTIZED[fmt], QUANTIZED[HEAD_FORMAT[fmt]]
    dtype = model.embed_tokens.weight.dtype
    held = held_format(model)
    if held is fmt:
        return 0
    if held is not WeightFormat.DEQUANTIZED or not isinstance(model.lm_head, nn.Linear | None):
        raise ValueError(
            f"weights: the model's projections were already replaced (packed or held as "
            f"{held.value}) by an earlier engine; load it again to hold it as {fmt.value}"
        )
    owners = _projections(model)
    ranges: dict[str, Tensor] = {}
    if fmt is WeightFormat.W8A8:
        if not calibration_ids:
            raise ValueError("weights: w8a8 needs a calibration text to smooth the inputs with")
        ranges = input_ranges(model, calibration_ids, owners)
    for owner, name, key in owners:
        linear = getattr(owner, name)
        quantized = _quantized(cls, linear.weight, linear.bias, dtype, key, ranges.get(key))
        setattr(owner, name, quantized)
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    model.lm_head = _quantized(head_cls, head, None, dtype, "lm_head", ranges.get("lm_head"))
    return len(owners) + 1


def held_format(model: LlamaModel) -> WeightFormat:
    """What the model's projections and head really are (the realized report says this).
    native leaves the projections of other tensor types dequantized, and its head may be."""
    kinds = {_kind(getattr(owner, name)) for owner, name, _ in _projections(model)}
    if WeightFormat.NATIVE in kinds:
        return WeightFormat.NATIVE
    if len(kinds) != 1:
        raise ValueError(f"weights: the model mixes {sorted(k.value for k in kinds)} projections")
    fmt = kinds.pop()
    head = _kind(model.lm_head)
    if head is not HEAD_FORMAT.get(fmt, WeightFormat.DEQUANTIZED):
        raise ValueError(f"weights: {fmt.value} projections with a {head.value} LM head")
    return fmt


def _kind(module: nn.Module | None) -> WeightFormat:
    if isinstance(module, NativeLinear):
        return WeightFormat.NATIVE
    for fmt in (WeightFormat.INT4, WeightFormat.INT8, WeightFormat.W8A8):
        if isinstance(module, QUANTIZED[fmt]):
            return fmt
    return WeightFormat.DEQUANTIZED


def _quantized(
    cls, weight: Tensor, bias: Tensor | None, dtype: torch.dtype, name: str, ranges: Tensor | None
):
    try:
        if cls is W8A8Linear:
            return cls(weight, bias, dtype, ranges)
        return cls(weight, bias, dtype)
    except WeightShapeError as error:
        raise WeightShapeError(f"{name}: {error}") from None


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model holds (parameters, persistent buffers, packed weights kept
    as plain attributes), each storage counted once. Non-persistent buffers are tables computed
    at start-up, not weights (RoPE's cos/sin: 64 MiB for Gemma 3's 32k positions), and not
    counted."""
    seen: dict[int, int] = {}
    for module in model.modules():
        skip = module._non_persistent_buffers_set
        buffers = [b for name, b in module.named_buffers(recurse=False) if name not in skip]
        tensors = [*module.parameters(recurse=False), *buffers]
        tensors += [v for v in vars(module).values() if isinstance(v, Tensor)]
        seen.update(_storage(tensor) for tensor in tensors)
    return sum(seen.values())


def _storage(tensor: Tensor) -> tuple[int, int]:
    """(an id of its memory, its bytes); oneDNN's packed weights are opaque: their own size."""
    if tensor.is_mkldnn or tensor.layout is not torch.strided:
        return id(tensor), tensor.numel() * tensor.element_size()
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()
