"""Quantized projection weights on CPU, through the matmuls torch ships.

    int8  per output channel, symmetric: w = q * scale            torch.ops.aten._weight_int8pack_mm
    int4  groups of 32 inputs, asymmetric: w = (q - 8) * s + z    _weight_int4pack_mm_for_cpu
    w8a8  int8 weights, each step's activations quantized to      int8_gemm.c (VNNI), or
          int8 per row: int8 x int8 -> int32 dot products        torch._int_mm

Both are quantized from the checkpoint's dequantized floats. For a Q4_1 GGUF (SmolLM2's) the int4
groups are the file's own blocks: Q4_1 stores 32 weights as q * d + m with q in 0..15, and its
block spans min..max exactly, so the min/max grouping below finds the same d, m and q again (the
only loss is d and m rounded to the compute dtype). Q4_0 and Q8_0 blocks are symmetric around
zero; their values re-quantize within one step of their own grid.

The int kernels beat the oneDNN-packed bf16 projections for steps of a few rows and lose badly
for large ones (bench/weights.py; docs/engine.md). A step with more than `KERNEL_MAX_ROWS` rows
(a batch of many sequences, a prefill chunk) dequantizes the weight for that one matmul instead:
only the quantized weight stays resident.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from intentserve.policy import WeightFormat
from intentserve.worker.model import cpu_ops
from torch import Tensor, nn

GROUP_SIZE = 32  # int4 inputs per scale/zero pair (Q4_0 / Q4_1 / Q8_0 block length)
INT4_BLOCK_N = 64  # output channels per block of the CPU int4 pack (AVX-512; AVX2: 32)
# Rows up to which a step uses the int kernel; measured crossover against dequantize + matmul.
KERNEL_MAX_ROWS = {WeightFormat.INT8: 16, WeightFormat.INT4: 16}


class WeightShapeError(ValueError):
    """A projection's shape does not fit the format's layout."""


class Int8Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.bias = None if bias is None else bias.detach().to(dtype)
        w = weight.detach().float()  # [out, in]
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        self.out_features, self.in_features = w.shape
        self.register_buffer("qweight", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scales", scale.to(dtype))  # [out]

    def dequantize(self) -> Tensor:  # [out, in] in the compute dtype
        return self.qweight.to(self.scales.dtype) * self.scales[:, None]

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        if x.shape[0] > KERNEL_MAX_ROWS[WeightFormat.INT8]:
            return F.linear(x, self.dequantize(), self.bias)
        out = torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)
        return out if self.bias is None else out + self.bias


def quantize_int4(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[out, in] floats -> (q in 0..15 as int32 [out, in], scale, zero [out, in/32]), such that
    w ~= (q - 8) * scale + zero."""
    out_features, in_features = w.shape
    groups = w.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.to(torch.int32).reshape(out_features, in_features), scale, low + 8.0 * scale


def int4_pack_lanes() -> int:
    """The channels one nibble of a byte column of torch's CPU int4 pack spans: 32 where torch's
    CPU kernels are its AVX-512 ones (blocks of 64 channels), 16 for its AVX2 ones (of 32)."""
    return 32 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 16


def unpack_int4(packed: Tensor, out_features: int, in_features: int) -> Tensor:
    """Inverse of `_convert_weight_to_int4pack_for_cpu(q, 1)` -> q [out, in] (uint8 0..15).

    NOTE: the pack's layout, as the probe's self-test checks on every start: per block of
    2 * L output channels (L = `int4_pack_lanes()`), byte [k, n % L] holds channel n's input k
    in its low nibble for n % (2 * L) < L, else in its high nibble.
    """
    lanes = int4_pack_lanes()
    blocks = packed.reshape(out_features // (2 * lanes), in_features, lanes)
    nibbles = torch.stack((blocks & 0xF, blocks >> 4), dim=1)  # [B, 2 (n half), K, L]
    # -> [B, n half, n % L, K] -> [out, in]
    return nibbles.permute(0, 1, 3, 2).reshape(out_features, in_features)


class Int4Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP_SIZE or self.out_features % INT4_BLOCK_N:
            raise WeightShapeError(
                f"a [{self.out_features}, {self.in_features}] projection does not fit int4's "
                f"layout (inputs a multiple of {GROUP_SIZE}, outputs of {INT4_BLOCK_N})"
            )
        q, scale, zero = quantize_int4(weight.detach())
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        # [in/32, out, 2]: the kernel's scales_and_zeros, in the activations' dtype
        scales_and_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(dtype))

    def dequantize(self) -> Tensor:  # [out, in] in the compute dtype
        q = unpack_int4(self.packed, self.out_features, self.in_features)
        groups = q.reshape(self.out_features, -1, GROUP_SIZE).to(self.scales_and_zeros.dtype) - 8
        scale, zero = self.scales_and_zeros.transpose(0, 1).unbind(-1)  # [out, in/32] each
        return (groups * scale[..., None] + zero[..., None]).reshape(
            self.out_features, self.in_features
        )

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        if x.shape[0] > KERNEL_MAX_ROWS[WeightFormat.INT4]:
            return F.linear(x, self.dequantize(), self.bias)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, GROUP_SIZE, self.scales_and_zeros
        )
        return out if self.bias is None else out + self.bias


SMOOTHING_ALPHA = 0.5  # how much of an input channel's range moves into the weights
_TINY = torch.finfo(torch.float32).tiny


def smoothing_factors(input_absmax: Tensor, weight: Tensor, alpha: float = SMOOTHING_ALPHA):
    """Per input channel j: s_j = max|x_j|^alpha / max|w_j|^(1 - alpha) (SmoothQuant's rule).

    A few input channels of a decoder's activations run far larger than the rest, and one scale
    per row would spend most of int8's range on them; dividing x by s and multiplying w's
    columns by s leaves the product unchanged in exact arithmetic and evens both out."""
    x_max = input_absmax.float().clamp(min=1e-5)
    w_max = weight.float().abs().amax(dim=0).clamp(min=1e-5)
    return (x_max.pow(alpha) / w_max.pow(1.0 - alpha)).clamp(min=1e-5)


def quantize_rows_reference(x: Tensor, inv_smooth: Tensor | None) -> tuple[Tensor, Tensor]:
    """The torch form of w8a8.h's quantize_rows (bit for bit the same)."""
    xs = x.float()
    if inv_smooth is not None:
        xs = xs * inv_smooth
    scales = xs.abs().amax(dim=1).clamp(min=_TINY) / 127.0
    return torch.round(xs / scales[:, None]).to(torch.int8), scales


def dequantize_rows_reference(
    acc: Tensor, row_scales: Tensor, col_scales: Tensor, dtype: torch.dtype
) -> Tensor:
    """The torch form of fused_ops.c's dequantize_rows and of int8_gemm.c's store (bit for bit)."""
    return (acc.float() * row_scales[:, None] * col_scales).to(dtype)


PACK_N, PACK_K = 16, 4  # int8_gemm.c's operand block: 4 inputs of 16 output channels


def pack_int8(qweight: Tensor) -> tuple[Tensor, Tensor]:
    """int8 [n, k] -> (the int8 GEMM kernel's layout [n/16, k/4, 16, 4], 128 * row sums int32)."""
    n, k = qweight.shape
    blocks = qweight.reshape(n // PACK_N, PACK_N, k // PACK_K, PACK_K)
    packed = blocks.permute(0, 2, 1, 3).contiguous()
    return packed, 128 * qweight.sum(dim=1, dtype=torch.int32)


def unpack_int8(packed: Tensor) -> Tensor:
    """Inverse of `pack_int8`'s layout -> int8 [n, k]."""
    n_blocks, k4, _, _ = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(n_blocks * PACK_N, k4 * PACK_K)


class W8A8Linear(nn.Module):
    """int8 x int8 -> int32 matmuls: weights int8 per output channel, and each step's activations
    quantized to int8 with one scale per row, after dividing each input channel by its smoothing
    factor (from `input_absmax`, measured on a calibration text; see `smoothing_factors`).

    Every row is quantized on its own and the integer products are exact, so a row's result does
    not depend on the other rows of its step (unlike int8/int4 above, no path switch by size).
    `fused` is set to the compiled fused ops on CPU (cpu_ops.enable_fused_ops) and
    `use_int8_gemm` moves the weight into the compiled int8 GEMM's layout where the CPU has VNNI;
    without them the same arithmetic runs as torch ops and torch._int_mm, bit for bit."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype, input_absmax: Tensor | None
    ) -> None:
        super().__init__()
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.dtype = dtype
        w = weight.detach().float()  # [out, in]
        self.out_features, self.in_features = w.shape
        if input_absmax is None:
            self.register_buffer("inv_smooth", None)
        else:
            if input_absmax.shape != (self.in_features,):
                raise WeightShapeError(
                    f"calibration ranges of shape {tuple(input_absmax.shape)} for a "
                    f"[{self.out_features}, {self.in_features}] projection"
                )
            smooth = smoothing_factors(input_absmax, w)
            w = w * smooth
            self.register_buffer("inv_smooth", (1.0 / smooth).contiguous())
        scale = w.abs().amax(dim=1).clamp(min=_TINY) / 127.0
        self.register_buffer("qweight", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scales", scale)  # [out], float32
        self.fused = None
        self.gemm = None  # the int8 GEMM kernel, once use_int8_gemm packed the weight for it
        self.register_buffer("packed", None)  # int8_gemm.c's layout, once use_int8_gemm ran
        self.register_buffer("comp", None)

    def use_int8_gemm(self, gemm) -> bool:
        """Hold the weight in the kernel's layout (instead of [out, in]: no second copy) and run
        the kernel from now on; False, nothing changed, when the shape does not fit it."""
        if self.in_features % PACK_K or self.out_features % PACK_N:
            return False
        if self.gemm is None:
            self.packed, self.comp = pack_int8(self.qweight)
            self.qweight = None
        self.gemm = gemm
        return True

    def int8_weight(self) -> Tensor:  # [out, in] int8, in whichever layout it is held
        return self.qweight if self.qweight is not None else unpack_int8(self.packed)

    def dequantize(self) -> Tensor:  # [out, in]: the effective weight, smoothing undone
        w = self.int8_weight().float() * self.scales[:, None]
        if self.inv_smooth is not None:
            w = w * self.inv_smooth
        return w.to(self.dtype)

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        suits = cpu_ops.suits_w8a8(x, self.out_features)
        if suits and self.gemm is not None:
            out = cpu_ops.w8a8_linear(
                self.gemm, x, self.inv_smooth, self.packed, self.comp, self.scales
            )
            return out if self.bias is None else out + self.bias
        ops = self.fused if suits else None
        if ops is not None:
            q, row_scales = cpu_ops.quantize_rows(ops, x, self.inv_smooth)
        else:
            q, row_scales = quantize_rows_reference(x, self.inv_smooth)
        acc = torch._int_mm(q, self.int8_weight().t())
        if ops is not None:
            out = cpu_ops.dequantize_rows(ops, acc, row_scales, self.scales, x.dtype)
        else:
            out = dequantize_rows_reference(acc, row_scales, self.scales, x.dtype)
        return out if self.bias is None else out + self.bias


QUANTIZED: dict[WeightFormat, type[Int8Linear] | type[Int4Linear] | type[W8A8Linear]] = {
    WeightFormat.INT8: Int8Linear,
    WeightFormat.INT4: Int4Linear,
    WeightFormat.W8A8: W8A8Linear,
}
