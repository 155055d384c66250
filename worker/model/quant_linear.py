"""Quantized projection weights on CPU, through the matmuls torch ships.

    int8  per output channel, symmetric: w = q * scale            torch.ops.aten._weight_int8pack_mm
    int4  groups of 32 inputs, asymmetric: w = (q - 8) * s + z    _weight_int4pack_mm_for_cpu

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
from torch import Tensor, nn

GROUP_SIZE = 32  # int4 inputs per scale/zero pair (Q4_0 / Q4_1 / Q8_0 block length)
INT4_BLOCK_N = 64  # output channels per block of the CPU int4 pack
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


def unpack_int4(packed: Tensor, out_features: int, in_features: int) -> Tensor:
    """Inverse of `_convert_weight_to_int4pack_for_cpu(q, 1)` -> q [out, in] (uint8 0..15).

    NOTE: the pack's layout, as the probe's self-test checks on every start: per block of 64
    output channels, byte [k // 2, (k % 2) * 32 + n % 32] holds channel n's input k in its low
    nibble for n % 64 < 32, else in its high nibble.
    """
    blocks = packed.reshape(out_features // INT4_BLOCK_N, in_features // 2, 2, 32)
    nibbles = torch.stack((blocks & 0xF, blocks >> 4), dim=1)  # [B, 2 (n half), K/2, 2, 32]
    # -> [B, n half, n % 32, K/2, k parity] -> [out, in]
    return nibbles.permute(0, 1, 4, 2, 3).reshape(out_features, in_features)


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


QUANTIZED: dict[WeightFormat, type[Int8Linear] | type[Int4Linear]] = {
    WeightFormat.INT8: Int8Linear,
    WeightFormat.INT4: Int4Linear,
}
