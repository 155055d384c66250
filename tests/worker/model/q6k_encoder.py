"""A test-only Q6_K encoder: gguf 0.19 dequantizes K-quants but cannot write them.

Q6_K (llama.cpp's block layout): super-blocks of 256 values, each 16 sub-blocks of 16 with an
int8 scale, one float16 super-scale `d`, and 6-bit values q in [-32, 31]: x ~= d * scale * q.
Bytes per block: 128 low nibbles (ql), 64 bytes of 2-bit high parts (qh), 16 scales, d. This
encoder picks scales from each sub-block's largest magnitude (llama.cpp refines them further, so
its files are a little more accurate); `gguf.quants.dequantize` is the judge of the layout.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
BLOCK_BYTES = 210


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """[rows, cols] float32 (cols a multiple of 256) -> [rows, cols // 256 * 210] uint8."""
    rows, cols = values.shape
    if cols % QK_K:
        raise ValueError(f"Q6_K needs rows of whole 256-value blocks; got {cols} columns")
    x = values.astype(np.float32).reshape(-1, QK_K // 16, 16)  # [blocks, sub-block, 16]
    num_blocks = x.shape[0]
    # Each sub-block's scale maps its largest-magnitude value to -32, the end of the range.
    biggest = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]  # [B, 16]
    sub_scale = biggest / -32.0
    # The super-scale maps the largest sub-scale to -128 in int8 the same way.
    top = np.take_along_axis(sub_scale, np.abs(sub_scale).argmax(-1)[:, None], -1)  # [B, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_d = np.where(top == 0, 0.0, -128.0 / top)
        scales = np.clip(np.round(sub_scale * inv_d), -128, 127).astype(np.int8)  # [B, 16]
        d = np.where(inv_d == 0, 0.0, 1.0 / inv_d).astype(np.float16)  # [B, 1]
        step = d.astype(np.float32) * scales.astype(np.float32)  # [B, 16]
        q = np.where(step[..., None] == 0, 0, np.round(x / step[..., None]))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(num_blocks, 2, 4, 32)  # [B, half, k, l]
    # Element 128*half + 32*k + l: low nibble in ql[64*half + 32*(k % 2) + l] (high half of the
    # byte for k >= 2), its top two bits in qh[32*half + l] at bit 2*k.
    ql = (q[:, :, 0:2] & 0x0F) | ((q[:, :, 2:4] & 0x0F) << 4)  # [B, 2, 2, 32]
    qh = sum(((q[:, :, k] >> 4) & 0x03) << (2 * k) for k in range(4)).astype(np.uint8)  # [B, 2, 32]
    blocks = np.concatenate(
        [
            ql.reshape(num_blocks, 128),
            qh.reshape(num_blocks, 64),
            scales.view(np.uint8),
            d.view(np.uint8).reshape(num_blocks, 2),
        ],
        axis=1,
    )
    return blocks.reshape(rows, cols // QK_K * BLOCK_BYTES)
