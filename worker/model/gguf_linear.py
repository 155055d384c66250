"""Projections and embeddings held as a GGUF file's own quantized blocks (`weights: native`).

A `GgufBlocks` is one tensor's bytes as the file stores them, [rows, bytes per row], each row
the blocks of one output channel (or one token's embedding). `NativeLinear` computes on one or
more of them side by side (a fused q|k|v or gate|up projection whose parts the file keeps apart,
each in its own type) through gguf_gemm.c: the step's activations are quantized once, per 32
values, then each part's matmul writes its own columns of the output. `NativeEmbedding` looks
tokens up by dequantizing their rows. Numerics: the weights are the file's, bit for bit; the
only rounding added is the activations' (int8, one scale per 32 values, as llama.cpp does).

Tensors whose rows come in groups of 8 are held interleaved (`interleave`, once at load: the
same bytes, 8 channels' blocks side by side, so one vector load serves 8 channels; gguf_x8.h,
and gguf_kx8.h for the K-quants), the layout that makes a one-row matmul bound by reading
them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.kernels import GgufGemm
from torch import Tensor, nn

# The tensor types held as they are; any other is dequantized (native_weights.py).
NATIVE_TYPES = (
    *(QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0),
    *(QType.Q4_K, QType.Q5_K, QType.Q6_K),
)
# The types with an interleaved kernel (every one held), and the channels it interleaves.
INTERLEAVED_TYPES = NATIVE_TYPES
INTERLEAVED_CHANNELS = 8
SUB_BLOCK = 32  # activations are quantized 32 values to a scale
_IO_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class GgufBlocks:
    """One GGUF tensor's blocks: `data` uint8 [rows, row bytes] for a [rows, cols] weight, in
    the file's order or `interleaved` (the same bytes, gguf_x8.h's order)."""

    qtype: QType
    data: Tensor
    cols: int
    interleaved: bool = False

    @property
    def rows(self) -> int:
        return self.data.shape[0]


def dequantize_blocks(
    kernel: GgufGemm, blocks: GgufBlocks, dtype: torch.dtype, rows: Tensor | None = None
) -> Tensor:
    """The blocks' rows (all, or those `rows` names, int64) as floats [count, cols] in `dtype`."""
    count = blocks.rows if rows is None else rows.numel()
    out = torch.empty(count, blocks.cols, dtype=dtype)
    index = None if rows is None else rows.to(torch.int64).contiguous()
    status = kernel.dequantize(
        blocks.qtype.value,
        blocks.data.data_ptr(),
        blocks.cols,
        None if index is None else index.data_ptr(),
        count,
        out.data_ptr(),
        int(dtype == torch.bfloat16),
        int(blocks.interleaved),
    )
    if status != 0:
        raise ValueError(f"the GGUF kernel does not read {blocks.qtype.name} rows of {blocks.cols}")
    return out


def interleave(kernel: GgufGemm, blocks: GgufBlocks) -> GgufBlocks:
    """`blocks` interleaved where their type has the layout and their rows come in whole groups
    of 8; else (or already interleaved) `blocks` themselves."""
    if (
        blocks.interleaved
        or blocks.qtype not in INTERLEAVED_TYPES
        or blocks.rows % INTERLEAVED_CHANNELS
    ):
        return blocks
    data = blocks.data.contiguous()
    out = torch.empty_like(data)
    status = kernel.interleave(
        blocks.qtype.value, data.data_ptr(), blocks.rows, blocks.cols, out.data_ptr()
    )
    if status != 0:
        raise ValueError(
            f"the GGUF kernel does not interleave {blocks.qtype.name} rows of {blocks.cols}"
        )
    return GgufBlocks(blocks.qtype, out, blocks.cols, interleaved=True)


class NativeLinear(nn.Module):
    """x [T, in] -> [T, out], out = the parts' outputs side by side (plus the bias), each part
    interleaved where it can be. `out_dtype` float32 keeps a head's logits unrounded; None gives
    x's dtype."""

    def __init__(
        self,
        parts: list[GgufBlocks],
        bias: Tensor | None,
        kernel: GgufGemm,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        widths = {part.cols for part in parts}
        if len(widths) != 1:
            raise ValueError(f"the parts of one projection have different widths {widths}")
        self.in_features = widths.pop()
        self.out_features = sum(part.rows for part in parts)
        parts = [interleave(kernel, part) for part in parts]
        self.qtypes = tuple(part.qtype for part in parts)
        self.interleaved = tuple(part.interleaved for part in parts)
        for i, part in enumerate(parts):
            self.register_buffer(f"blocks{i}", part.data)
        self.bias = None if bias is None else bias.detach()
        self.kernel = kernel
        self.out_dtype = out_dtype

    @property
    def parts(self) -> list[GgufBlocks]:
        return [
            GgufBlocks(qtype, getattr(self, f"blocks{i}"), self.in_features, interleaved)
            for i, (qtype, interleaved) in enumerate(
                zip(self.qtypes, self.interleaved, strict=True)
            )
        ]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:  # [out, in]
        return torch.cat([dequantize_blocks(self.kernel, part, dtype) for part in self.parts])

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        if x.dtype not in _IO_DTYPES:
            raise TypeError(f"native weights compute on float32 or bfloat16, not {x.dtype}")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).contiguous()
        rows, k = x.shape
        q = torch.empty(rows, k, dtype=torch.int8)
        scales = torch.empty(2, rows, k // SUB_BLOCK, dtype=torch.float32)  # d, then d * sum(q)
        self.kernel.quantize_rows(
            x.data_ptr(),
            rows,
            k,
            int(x.dtype == torch.bfloat16),
            q.data_ptr(),
            scales[0].data_ptr(),
            scales[1].data_ptr(),
        )
        dtype = self.out_dtype or x.dtype
        out = torch.empty(rows, self.out_features, dtype=dtype)
        column = 0
        for part in self.parts:
            status = self.kernel.gemm(
                part.qtype.value,
                part.data.data_ptr(),
                part.rows,
                k,
                q.data_ptr(),
                scales[0].data_ptr(),
                scales[1].data_ptr(),
                rows,
                out.data_ptr() + column * out.element_size(),
                self.out_features,
                int(dtype == torch.bfloat16),
                int(part.interleaved),
            )
            if status != 0:
                raise RuntimeError(f"the GGUF kernel refused a {part.qtype.name} matmul")
            column += part.rows
        if self.bias is not None:
            out += self.bias
        return out.reshape(*lead, self.out_features)


class NativeEmbedding(nn.Module):
    """Token ids -> their rows of the embedding table, dequantized from its blocks."""

    def __init__(self, blocks: GgufBlocks, kernel: GgufGemm, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("blocks", blocks.data)
        self.qtype, self.embedding_dim = blocks.qtype, blocks.cols
        self.interleaved = blocks.interleaved
        self.kernel, self.dtype = kernel, dtype

    def forward(self, ids: Tensor) -> Tensor:  # [T] -> [T, hidden]
        num_tokens = self.blocks.shape[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_tokens):
            raise IndexError(f"token ids must be in [0, {num_tokens}); got {ids.tolist()}")
        rows = GgufBlocks(self.qtype, self.blocks, self.embedding_dim, self.interleaved)
        out = dequantize_blocks(self.kernel, rows, self.dtype, ids.reshape(-1))
        return out.reshape(*ids.shape, self.embedding_dim)
