"""Fused CPU forms of a decoder layer's elementwise steps, from the compiled
`worker/attention/cpu_kernels/fused_ops.c`: residual add + RMSNorm in one pass, SiLU(gate) * up
in one pass, and the rotary embedding of q and k in place. They round where the torch ops they
replace round (see the C file), so switching them on changes speed, not results (bf16 logits
measured identical on SmolLM2).

`enable_fused_ops(model)` switches a CPU model over; where the library cannot be built the model
keeps its torch ops and the reason is logged and reported.
"""

from __future__ import annotations

import logging

import torch
from intentserve.worker.attention.cpu_kernels import FusedOps, KernelUnavailable, fused_ops
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
    ops: FusedOps, x: Tensor, residual: Tensor | None, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor] | None:
    """(RMSNorm(x + residual) * weight, x + residual), the sum written into `residual` in place;
    without a residual, (RMSNorm(x) * weight, x). None when the tensors do not suit the kernel."""
    tensors = (x, weight) if residual is None else (x, residual, weight)
    if x.dim() != 2 or not _suits(x.shape[1], *tensors):
        return None
    out = torch.empty_like(x)
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


def silu_and_mul(ops: FusedOps, gate_up: Tensor) -> Tensor | None:
    """SiLU(gate) * up for rows laid out [gate | up]; None when the tensor does not suit."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not _suits(gate_up.shape[1] // 2, gate_up):
        return None
    rows, width = gate_up.shape
    out = torch.empty((rows, width // 2), dtype=gate_up.dtype)
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


def enable_fused_ops(model) -> str:
    """Give every RMSNorm and MLP of a CPU model the fused ops; returns what runs, in words."""
    if model.embed_tokens.weight.device.type != "cpu":
        return "torch ops (the model is not on the CPU)"
    try:
        ops = fused_ops()
    except KernelUnavailable as exc:
        log.warning("norms and activations stay in torch ops: %s", exc.reason)
        return f"torch ops ({exc.reason})"
    takers = [module for module in model.modules() if hasattr(module, "fused")]
    for module in takers:
        module.fused = ops
    # Gemma's norms (1 + w, scaled in float32) and GELU have no fused kernel.
    return "fused CPU kernels" if takers else "torch ops (none fused for this model)"


def disable_fused_ops(model) -> None:
    """Back to the torch ops (for comparisons; the results agree, see the tests)."""
    for module in model.modules():
        if hasattr(module, "fused"):
            module.fused = None
