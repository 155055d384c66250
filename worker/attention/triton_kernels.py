"""The Triton kernels of the `triton_paged` backend.

`paged_attention`: attention over the paged KV pool for a whole step, prefill chunks and decodes
mixed, in one launch a layer. One program takes a tile of BLOCK_Q query tokens of one sequence and
one KV head; the GROUP query heads that share that KV head ride along as rows, so grouped-query
attention reads each K/V row once for all of them (rows = BLOCK_Q x GROUP_PAD, token-major).
K/V are read in place through the sequence's block table, BLOCK_N positions at a time, with a
float32 online softmax; a cache stored in fp8 is widened to the query's dtype as it is read.

NOTE: Triton's interpreter multiplies bf16/fp16 blocks in tl.dot wrongly (it reads their bits as
integers: 2.7e10 off on a 16 x 16 product, Triton 3.9), so under the interpreter the products'
inputs are float32 (DOT_DTYPE); compiled, they are the query's dtype.

`store_kv`: the step's new K/V rows (already in the pool's dtype) into the pool; a negative slot
is skipped, so padded rows of a captured batch write nothing.

The functions are plain Python until `load_kernels` wraps them: `triton.jit` compiles them for
CUDA; with TRITON_INTERPRET=1, Triton's interpreter runs the same code on CPU tensors (tests,
`make gpu-check DRY_RUN=1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

# A band of `window` tokens where a layer has none: wide enough for any context, small enough
# that `position - NO_WINDOW` stays inside int32.
NO_WINDOW = 1 << 30
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _paged_attention(
    q_ptr,  # [T, H, D], any row and head strides, dense D
    k_ptr,  # [rows, Hkv, D]: the layer's flat K pool
    v_ptr,
    out_ptr,  # [T, H, D]
    tables_ptr,  # [B, W] int32 block table per sequence
    context_lens_ptr,  # [B] int32: tokens in the cache after this step
    query_start_ptr,  # [B + 1] int32: row offsets of each sequence's new tokens
    tile_seq_ptr,  # [num_tiles] int32: the sequence of each tile
    tile_q0_ptr,  # [num_tiles] int32: the tile's first query token within its sequence
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kv_row,
    stride_kv_head,
    stride_table,
    scale,
    window,  # tokens in the band (NO_WINDOW: the whole context)
    block_size,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # HEAD_DIM rounded up to a power of two (>= 16)
    BLOCK_N: tl.constexpr,  # key positions per inner step
    DOT_DTYPE: tl.constexpr,  # the products' inputs: the query's dtype (float32: interpreter)
    PRECISION: tl.constexpr,  # tl.dot's input precision: "ieee" for float32 inputs
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_begin = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - q_begin
    context_len = tl.load(context_lens_ptr + seq)
    first_pos = context_len - query_len  # position of the sequence's first new token

    m = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = q0 + m // GROUP_PAD  # query token within the sequence
    g = m % GROUP_PAD
    row_ok = (tok < query_len) & (g < GROUP)
    q_pos = first_pos + tok
    head = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    q_rows = (q_begin + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_q_tok + head[:, None] * stride_q_head + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    # Keys this tile can see: from the band's floor of its first token up to its last token.
    hi = first_pos + tl.minimum(q0 + BLOCK_Q, query_len)
    lo = tl.maximum(first_pos + q0 - window + 1, 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    for start in range(lo, hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < hi
        block = tl.load(tables_ptr + seq * stride_table + k_pos // block_size, mask=k_ok, other=0)
        rows = block.to(tl.int64) * block_size + k_pos % block_size
        kv_offsets = rows[:, None] * stride_kv_row + kv_head * stride_kv_head + d[None, :]
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [M, BLOCK_N] fp32
        seen = (
            k_ok[None, :]
            & (k_pos[None, :] <= q_pos[:, None])
            & (k_pos[None, :] > q_pos[:, None] - window)
        )
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_o_tok + head[:, None] * stride_o_head + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def _store_kv(
    k_ptr,  # [T, Hkv, D] new keys in the pool's dtype, any row and head strides, dense D
    v_ptr,
    k_cache_ptr,  # [rows, Hkv, D] the layer's flat pool
    v_cache_ptr,
    slots_ptr,  # [T] int64 flat cache row of each new token; < 0: skip
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_c_row,
    stride_c_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slots_ptr + tok)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (d < HEAD_DIM) & ((d * 0 + slot) >= 0)  # the slot broadcast over the row
    dst = slot * stride_c_row + head * stride_c_head + d
    tok64 = tok.to(tl.int64)
    k = tl.load(k_ptr + tok64 * stride_k_tok + head * stride_k_head + d, mask=mask)
    v = tl.load(v_ptr + tok64 * stride_v_tok + head * stride_v_head + d, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@dataclass(frozen=True)
class TritonKernels:
    paged_attention: Any  # launched as paged_attention[grid](...)
    store_kv: Any
    interpreted: bool  # True: Triton's interpreter on CPU tensors, not compiled code

    def dot_inputs(self, q_dtype: torch.dtype) -> tuple[Any, str]:
        """(DOT_DTYPE, PRECISION) for queries of `q_dtype` (see the NOTE at the top)."""
        if self.interpreted or q_dtype == torch.float32:
            return tl.float32, "ieee"
        return _TL_DTYPES[q_dtype], "tf32"  # "tf32" is ignored for 16-bit inputs

    @property
    def impl(self) -> str:
        how = "Triton interpreter" if self.interpreted else f"Triton {triton.__version__}"
        return f"intentserve paged_attention kernel ({how})"


def load_kernels() -> TritonKernels:
    """The kernels compiled for CUDA, or, where TRITON_INTERPRET=1 was set before triton was
    first imported, run by Triton's interpreter on CPU tensors.

    NOTE: the interpreter is chosen at import, not per kernel: triton.language's own helpers
    (tl.max, tl.sum, ...) are wrapped as compiled or interpreted when triton is imported."""
    interpreted = bool(triton.knobs.runtime.interpret)
    return TritonKernels(triton.jit(_paged_attention), triton.jit(_store_kv), interpreted)
