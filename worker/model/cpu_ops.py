"""Fused CPU forms of a decoder layer's elementwise steps, from the compiled
`worker/kernels/ops/fused_ops.c`: residual add + RMSNorm in one pass, SiLU(gate) * up
in one pass, and the rotary embedding of q and k in place; and Gemma 3's from `gemma_ops.c`:
its (1 + w) norm (the residual add after it), q/k norms + rotary, GELU(gate) * up. They round
where the torch ops they replace round (see the C files), so switching them on changes speed,
not results (bf16 logits measured identical on SmolLM2; Gemma's: within the summation order,
tests/worker/model/test_gemma_ops.py).

`enable_fused_ops(model)` switches a CPU model over; where the library cannot be built the model
keeps its torch ops and the reason is logged and reported.
"""

from __future__ import annotations

import logging

import torch
from intentserve.worker.kernels import (
    FusedOps,
    GemmaOps,
    Int8Gemm,
    KernelUnavailable,
    fused_ops,
    gemma_ops,
    int8_gemm_kernel,
)
from intentserve.worker.model.step_buffers import StepBuffers, out_tensor
from torch import Tensor

log = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16)
_LANES = 16  # the kernels work in rows of whole 16-lane vectors


def _suits(width: int, *tensors: Tensor) -> bool:
    first = tensors[0]
    return (
        width % _LANES == 0
        and first.dtype in _DTYPES
        and all(
            t.device.type == "cpu" and t.dtype == first.dtype and t.is_contiguous() for t in tensors
        )
    )


def add_rmsnorm(
    ops: FusedOps,
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor,
    eps: float,
    kept: tuple[StepBuffers, str] | None = None,
) -> tuple[Tensor, Tensor] | None:
    """(RMSNorm(x + residual) * weight, x + residual), the sum written into `residual` in place;
    without a residual, (RMSNorm(x) * weight, x). None when the tensors do not suit the kernel.
    `kept`: the output goes into that kept buffer (step_buffers.py) instead of a fresh tensor."""
    tensors = (x, weight) if residual is None else (x, residual, weight)
    if x.dim() != 2 or not _suits(x.shape[1], *tensors):
        return None
    out = out_tensor(kept, *x.shape, x.dtype)
    fn = ops.add_rmsnorm_bf16 if x.dtype == torch.bfloat16 else ops.add_rmsnorm_f32
    rows, hidden = x.shape
    fn(
        x.data_ptr(),
        None if residual is None else residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        rows,
        hidden,
        eps,
    )
    return out, (x if residual is None else residual)


def silu_and_mul(
    ops: FusedOps, gate_up: Tensor, kept: tuple[StepBuffers, str] | None = None
) -> Tensor | None:
    """SiLU(gate) * up for rows laid out [gate | up]; None when the tensor does not suit.
    `kept`: the output goes into that kept buffer (step_buffers.py) instead of a fresh tensor."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not _suits(gate_up.shape[1] // 2, gate_up):
        return None
    rows, width = gate_up.shape
    out = out_tensor(kept, rows, width // 2, gate_up.dtype)
    fn = ops.silu_mul_bf16 if gate_up.dtype == torch.bfloat16 else ops.silu_mul_f32
    fn(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


def rotary_(
    ops: FusedOps, qkv: Tensor, cos: Tensor, sin: Tensor, num_heads: int, head_dim: int
) -> bool:
    """Rotate the first `num_heads` heads of each row of qkv [T, width] in place (q and k of a
    fused projection; v after them is left alone); cos, sin: [T, 1, head_dim // 2].
    False, and nothing touched, when the tensors do not suit the kernel."""
    if qkv.dim() != 2 or cos.shape != (qkv.shape[0], 1, head_dim // 2):
        return False
    if head_dim % 2 or qkv.shape[1] < num_heads * head_dim:
        return False
    if not _suits(head_dim // 2, qkv, cos, sin):
        return False
    fn = ops.rotary_bf16 if qkv.dtype == torch.bfloat16 else ops.rotary_f32
    rows, width = qkv.shape
    fn(qkv.data_ptr(), width, cos.data_ptr(), sin.data_ptr(), rows, num_heads, head_dim)
    return True


def gemma_norm(
    ops: GemmaOps, x: Tensor, scale: Tensor, eps: float, residual: Tensor | None = None
) -> Tensor | None:
    """Gemma's RMSNorm of x [rows, hidden] times `scale` (float32, 1 + w), rounded once; with a
    residual, residual + that, written into `residual` in place (returned). None, and nothing
    touched, when the tensors do not suit the kernel."""
    tensors = (x,) if residual is None else (x, residual)
    if x.dim() != 2 or scale.dtype != torch.float32 or not _suits(x.shape[1], *tensors):
        return None
    if residual is not None and residual.shape != x.shape:
        return None
    fn = ops.gemma_norm_bf16 if x.dtype == torch.bfloat16 else ops.gemma_norm_f32
    rows, hidden = x.shape
    if residual is not None:
        fn(x.data_ptr(), residual.data_ptr(), scale.data_ptr(), None, rows, hidden, eps)
        return residual
    out = torch.empty_like(x)
    fn(x.data_ptr(), None, scale.data_ptr(), out.data_ptr(), rows, hidden, eps)
    return out


def qk_norm_rotary_(
    ops: GemmaOps,
    qkv: Tensor,
    q_scale: Tensor,
    k_scale: Tensor,
    cos: Tensor,
    sin: Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    q_multiplier: float,
) -> bool:
    """Gemma's q and k heads of qkv [T, width] normed per head (q_scale, k_scale: float32
    [head_dim]), rotated (cos, sin: [T, 1, head_dim // 2]) and q times q_multiplier, in place.
    False, and nothing touched, when the tensors do not suit the kernel."""
    if qkv.dim() != 2 or cos.shape != (qkv.shape[0], 1, head_dim // 2) or head_dim % 2:
        return False
    if qkv.shape[1] < (num_heads + num_kv_heads) * head_dim:
        return False
    if q_scale.dtype != torch.float32 or k_scale.dtype != torch.float32:
        return False
    if not _suits(head_dim // 2, qkv, cos, sin):
        return False
    fn = ops.qk_norm_rotary_bf16 if qkv.dtype == torch.bfloat16 else ops.qk_norm_rotary_f32
    rows, width = qkv.shape
    fn(
        qkv.data_ptr(),
        width,
        q_scale.data_ptr(),
        k_scale.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        rows,
        num_heads,
        num_kv_heads,
        head_dim,
        eps,
        q_multiplier,
    )
    return True


def gelu_and_mul(ops: GemmaOps, gate_up: Tensor) -> Tensor | None:
    """GELU(tanh)(gate) * up for rows laid out [gate | up]; None when the tensor does not suit."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not _suits(gate_up.shape[1] // 2, gate_up):
        return None
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype)
    fn = ops.gelu_mul_bf16 if gate_up.dtype == torch.bfloat16 else ops.gelu_mul_f32
    fn(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


def quantize_rows(
    ops: FusedOps, x: Tensor, inv_smooth: Tensor | None, *, unsigned: bool = False
) -> tuple[Tensor, Tensor]:
    """x [rows, width] -> (int8 [rows, width], float32 scales [rows]), as
    `quant_linear.quantize_rows_reference` computes them; `unsigned`: uint8 q + 128 instead (the
    int8 GEMM kernel's operand). The caller checks `suits_w8a8`."""
    rows, width = x.shape
    q = torch.empty((rows, width), dtype=torch.uint8 if unsigned else torch.int8)
    scales = torch.empty(rows, dtype=torch.float32)
    fn = ops.quantize_rows_bf16 if x.dtype == torch.bfloat16 else ops.quantize_rows_f32
    smooth = None if inv_smooth is None else inv_smooth.data_ptr()
    fn(x.data_ptr(), smooth, q.data_ptr(), scales.data_ptr(), rows, width, 128 if unsigned else 0)
    return q, scales


def int8_gemm(
    gemm: Int8Gemm,
    a: Tensor,
    packed: Tensor,
    comp: Tensor,
    row_scales: Tensor,
    col_scales: Tensor,
    dtype: torch.dtype,
) -> Tensor:
    """uint8 a [rows, k] (q + 128) times the packed int8 weight -> [rows, n] in `dtype`,
    dequantized as `dequantize_rows` does; `packed` comes from `quant_linear.pack_int8`."""
    rows, k = a.shape
    n = comp.shape[0]
    out = torch.empty((rows, n), dtype=dtype)
    fn = gemm.bf16 if dtype == torch.bfloat16 else gemm.f32
    status = fn(
        a.data_ptr(),
        rows,
        k,
        packed.data_ptr(),
        comp.data_ptr(),
        n,
        row_scales.data_ptr(),
        col_scales.data_ptr(),
        out.data_ptr(),
    )
    if status != 0:
        raise RuntimeError("the int8 GEMM kernel was built without VNNI or ran out of memory")
    return out


def w8a8_linear(
    gemm: Int8Gemm,
    x: Tensor,
    inv_smooth: Tensor | None,
    packed: Tensor,
    comp: Tensor,
    col_scales: Tensor,
) -> Tensor:
    """x [rows, k] -> [rows, n] in x's dtype: `quantize_rows` (unsigned) and `int8_gemm` in one
    call, the same bits. The caller checks `suits_w8a8`."""
    rows, k = x.shape
    n = comp.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype)
    fn = gemm.linear_bf16 if x.dtype == torch.bfloat16 else gemm.linear_f32
    status = fn(
        x.data_ptr(),
        None if inv_smooth is None else inv_smooth.data_ptr(),
        rows,
        k,
        packed.data_ptr(),
        comp.data_ptr(),
        n,
        col_scales.data_ptr(),
        out.data_ptr(),
    )
    if status != 0:
        raise RuntimeError("the int8 GEMM kernel was built without VNNI or ran out of memory")
    return out


def dequantize_rows(
    ops: FusedOps, acc: Tensor, row_scales: Tensor, col_scales: Tensor, dtype: torch.dtype
) -> Tensor:
    """int32 acc [rows, cols] -> (acc * row_scales[:, None]) * col_scales, stored in `dtype`."""
    rows, cols = acc.shape
    out = torch.empty((rows, cols), dtype=dtype)
    fn = ops.dequantize_rows_bf16 if dtype == torch.bfloat16 else ops.dequantize_rows_f32
    fn(acc.data_ptr(), row_scales.data_ptr(), col_scales.data_ptr(), out.data_ptr(), rows, cols)
    return out


def suits_w8a8(x: Tensor, out_features: int) -> bool:
    """Whether a w8a8 matmul's activations and output fit the kernels' whole 16-lane rows."""
    return x.dim() == 2 and out_features % _LANES == 0 and _suits(x.shape[1], x)


def enable_fused_ops(model) -> str:
    """Give every RMSNorm and MLP of a CPU model the fused ops; returns what runs, in words."""
    if model.device.type != "cpu":
        return "torch ops (the model is not on the CPU)"
    try:
        ops = fused_ops()
    except KernelUnavailable as exc:
        log.warning("norms and activations stay in torch ops: %s", exc.reason)
        return f"torch ops ({exc.reason})"
    takers = [module for module in model.modules() if hasattr(module, "fused")]
    for module in takers:
        module.fused = ops
    gemma_takers = [module for module in model.modules() if hasattr(module, "gemma_ops")]
    if gemma_takers:  # Gemma's norms (1 + w, scaled in float32), q/k norms and GELU
        try:
            gemma = gemma_ops()
        except KernelUnavailable as exc:
            log.warning("Gemma's norms and activations stay in torch ops: %s", exc.reason)
            return f"torch ops ({exc.reason})"
        for module in gemma_takers:
            module.gemma_ops = gemma
    return (
        "fused CPU kernels" if takers or gemma_takers else "torch ops (none fused for this model)"
    )


def enable_int8_gemm(model) -> str:
    """Move every w8a8 projection of a CPU model onto the compiled int8 GEMM (VNNI or AMX); returns
    what runs, in words. Without the kernel they keep torch._int_mm, with the same results."""
    takers = [module for module in model.modules() if hasattr(module, "use_int8_gemm")]
    if not takers:
        return ""
    try:
        gemm = int8_gemm_kernel()
    except KernelUnavailable as exc:
        log.warning("w8a8 matmuls stay on torch._int_mm: %s", exc.reason)
        return f"torch._int_mm ({exc.reason})"
    moved = sum(module.use_int8_gemm(gemm) for module in takers)
    return f"int8 GEMM kernel ({gemm.isa()}) for {moved} of {len(takers)} w8a8 matmuls"


def disable_fused_ops(model) -> None:
    """Back to the torch ops (for comparisons; the results agree, see the tests)."""
    for module in model.modules():
        if hasattr(module, "fused"):
            module.fused = None
        if hasattr(module, "gemma_ops"):
            module.gemma_ops = None
