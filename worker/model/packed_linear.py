"""CPU weight prepacking: every projection's weight reordered once, for the matmul that runs it.

- bfloat16 on a CPU with AVX512-BF16: `Bf16Linear`, the weight in bf16_gemm.c's layout. Against
  oneDNN's packed matmul on SmolLM2's shapes, weights cold, one process (docs/engine.md): 20-27%
  less time per layer at 1-8 rows, 16-20% less at 32-64. Where the CPU has AMX the same layout
  feeds its tiles (bf16_gemm.c), 2.5-5x the AVX512-BF16 path at 32-64 rows there.
- float32 on a CPU with AVX-512: `F32Linear`, the weight in f32_gemm.c's layout. Against
  oneDNN's packed float32 matmul on SmolLM2's 120 layer projections, weights cold, one process
  (Xeon VM, 2026-12-02, alternated, median of 7): 22.2 -> 18.4 ms at one row (19 -> 23 GB/s of
  weights), 33.1 -> 22.6 at 8, 46.1 -> 37.0 at 32, 82.5 -> 62.0 at 64.
- Otherwise (no AVX-512 or no AVX512-BF16, or no compiler): `PackedLinear`, oneDNN's blocked
  layout. Measured on this 2-core AVX-512 machine: at 32-64 rows a packed bf16 projection runs at
  ~400 GFLOP/s against ~250 for `F.linear` on the plain weight, fp32 at ~215 against ~130.
- bfloat16 where oneDNN cannot pack it either (no avx_ne_convert, no avx512bw/vl/dq: an AVX2-only
  CPU): the projection keeps its plain weight, on `F.linear`, and the words returned say why.

Each serves any number of rows with row results independent of the batch, and neither keeps the
plain weight. CUDA keeps plain `nn.Linear`.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from intentserve.worker.kernels import (
    Bf16Gemm,
    F32Gemm,
    KernelUnavailable,
    bf16_gemm_kernel,
    f32_gemm_kernel,
)
from intentserve.worker.model import dtype as dtype_module
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.step_buffers import out_tensor
from torch import Tensor, nn

log = logging.getLogger(__name__)

# The layout is tuned for this many rows; correctness does not depend on it.
BATCH_HINT = 64


def prepack_available() -> tuple[bool, str]:
    """(True, "") when this torch build can run packed oneDNN linears, else (False, why)."""
    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False, f"torch {torch.__version__} has no mkldnn._linear_pointwise"
    return True, ""


class PackedLinear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # [out, in] -> opaque blocked layout; the plain weight is not kept.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


# bf16_gemm.c's flags: the weight is packed grouped (below)
GEMM_GROUPED = 0x100
GROUP_BLOCKS = 3  # blocks of 16 channels in a group: the kernels' tiles are 48 channels wide


def _group_blocks(blocks: Tensor) -> Tensor:
    """[blocks, 16, steps, *vector] -> the grouped order, flat: each group of GROUP_BLOCKS blocks
    (the last may have fewer) as [steps][blocks in it][16][*vector], groups one after another."""
    order = (2, 0, 1, *range(3, blocks.dim()))
    groups = range(0, len(blocks), GROUP_BLOCKS)
    return torch.cat([blocks[g : g + GROUP_BLOCKS].permute(order).reshape(-1) for g in groups])


def _ungroup_blocks(packed: Tensor, num_blocks: int, step_shape: tuple[int, ...]) -> Tensor:
    """The inverse of `_group_blocks`: -> [blocks, 16, *step_shape] (steps, then the vector)."""
    per_block = 16 * math.prod(step_shape)
    order = (1, 2, 0, *range(3, len(step_shape) + 2))
    parts, done = [], 0
    for g in range(0, num_blocks, GROUP_BLOCKS):
        n = min(GROUP_BLOCKS, num_blocks - g) * per_block
        group = packed[done : done + n].view(step_shape[0], -1, 16, *step_shape[1:])
        parts.append(group.permute(order))
        done += n
    return torch.cat(parts)


class Bf16Linear(nn.Module):
    """A bfloat16 projection on bf16_gemm.c, a float32 bias added to the float32 sums before their
    one rounding to bfloat16. `out_dtype=float32` keeps the sums unrounded (the LM head: logits
    are wanted in float32 anyway, and the kernel writing them saves a conversion pass over
    [rows, vocab]).

    The weight is packed in blocks of 16 output channels, a vector holding 2 consecutive inputs
    of a block's 16 channels, in groups of 3 blocks: `grouped` [groups][in/2][blocks][16][2],
    where one step of the kernel's tile reads adjacent vectors (one stream of the memory, which
    a one-row GEMV is bound by); or, where the calls run on AMX tiles (whose B operand is a
    block's vectors in a row), `[out/16][in/2][16][2]`. Both have each group at the same
    place."""

    dtype = torch.bfloat16  # what x must be for the kernel to run
    isa_name = "bf16 GEMM kernel"

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        gemm: Bf16Gemm,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype: {out_dtype} is not one of bfloat16, float32")
        self.out_dtype = out_dtype
        self.out_features, self.in_features = weight.shape
        self.grouped = self._grouped(gemm)
        self.register_buffer("packed", self._pack(weight.detach()))
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.gemm = gemm
        self.out_buffer = None  # a kept output buffer, set by step_buffers.keep_step_buffers

    @staticmethod
    def _grouped(gemm) -> bool:
        return not gemm.amx(-1)

    @property
    def gemm_flags(self) -> int:
        """How the weight is packed, as bf16_gemm.c's `flags` say it."""
        return GEMM_GROUPED if self.grouped else 0

    def _pack(self, weight: Tensor) -> Tensor:
        w = weight.to(torch.bfloat16)
        blocks = w.reshape(self.out_features // 16, 16, self.in_features // 2, 2)
        if not self.grouped:
            return blocks.permute(0, 2, 1, 3).contiguous()
        return _group_blocks(blocks)

    def _unpack(self) -> Tensor:  # -> [out/16, 16, in/2, 2]
        if not self.grouped:
            return self.packed.permute(0, 2, 1, 3)
        return _ungroup_blocks(self.packed, self.out_features // 16, (self.in_features // 2, 2))

    @staticmethod
    def fits(weight: Tensor) -> bool:
        out_features, in_features = weight.shape
        return out_features % 16 == 0 and in_features % 2 == 0

    def weight(self) -> Tensor:  # [out, in] bfloat16, unpacked
        return self._unpack().reshape(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        if x.dtype != self.dtype or x.dim() != 2:  # not what the model sends; still right
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.weight().to(x.dtype), bias)
        x = x.contiguous()
        out = out_tensor(self.out_buffer, x.shape[0], self.out_features, self.out_dtype)
        status = self.gemm.gemm(
            x.data_ptr(),
            x.shape[0],
            self.in_features,
            self.packed.data_ptr(),
            None if self.bias is None else self.bias.data_ptr(),
            self.out_features,
            out.data_ptr(),
            int(self.out_dtype == torch.float32) | self.gemm_flags,
        )
        if status != 0:
            raise RuntimeError(f"the {self.isa_name} is not built for this CPU")
        return out


class F32Linear(Bf16Linear):
    """A float32 projection on f32_gemm.c: the weight in blocks of 16 output channels, grouped 3
    blocks at a time as [groups][in][blocks][16] (one stream per tile, as Bf16Linear's grouped
    order), a float32 bias added to the sums; out float32."""

    dtype = torch.float32
    isa_name = "float32 GEMM kernel"

    def __init__(self, weight: Tensor, bias: Tensor | None, gemm: F32Gemm) -> None:
        super().__init__(weight, bias, gemm, torch.float32)

    @staticmethod
    def _grouped(gemm) -> bool:
        return False  # f32_gemm.c has one order, and no flag for it

    def _pack(self, weight: Tensor) -> Tensor:
        return _group_blocks(weight.float().reshape(self.out_features // 16, 16, self.in_features))

    @staticmethod
    def fits(weight: Tensor) -> bool:
        return weight.shape[0] % 16 == 0

    def weight(self) -> Tensor:  # [out, in] float32, unpacked
        blocks = _ungroup_blocks(self.packed, self.out_features // 16, (self.in_features,))
        return blocks.reshape(self.out_features, self.in_features)


def _projections(model: LlamaModel) -> list[tuple[nn.Module, str]]:
    owners = [(model, "lm_head")]
    for layer in model.layers:
        owners += [
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        ]
    return owners


def prepack_linears(model: LlamaModel, *, kernels: bool = True) -> str:
    """Replace the model's projections (and its LM head) with packed ones, in place; returns what
    runs them, in words. Idempotent. A tied LM head gets a packed copy of the embedding, since
    the embedding lookup still needs the plain table. `kernels=False` keeps oneDNN for every
    dtype (for comparisons). Where oneDNN cannot pack bf16 on this CPU, a projection the kernel
    does not take keeps its plain weight (F.linear)."""
    if model.embed_tokens.weight.device.type != "cpu":
        return ""
    dtype = model.embed_tokens.weight.dtype
    kind: type[Bf16Linear] = Bf16Linear if dtype == torch.bfloat16 else F32Linear
    gemm, why = None, ""
    if not kernels:
        why = "the GEMM kernels were turned off"
    elif dtype in (torch.bfloat16, torch.float32):
        try:
            gemm = bf16_gemm_kernel() if kind is Bf16Linear else f32_gemm_kernel()
        except KernelUnavailable as exc:
            why = exc.reason
            log.info("%s projections stay on oneDNN: %s", dtype, why)
    else:
        why = f"{dtype} weights"
    onednn_packs, onednn_lacks = (
        dtype_module.cpu_packs_bf16_for_onednn() if dtype == torch.bfloat16 else (True, "")
    )
    owners = _projections(model)
    for owner, name in owners:
        linear = getattr(owner, name)
        if isinstance(linear, PackedLinear | Bf16Linear):
            continue
        if linear is None:  # a tied head
            weight, bias = model.embed_tokens.weight, None
        else:
            weight, bias = linear.weight, linear.bias
        if gemm is not None and kind.fits(weight):
            if kind is F32Linear:
                setattr(owner, name, F32Linear(weight, bias, gemm))
            else:
                # The head's logits go to the sampler in float32: written so, not rounded first.
                out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
                setattr(owner, name, Bf16Linear(weight, bias, gemm, out_dtype))
        elif onednn_packs:
            setattr(owner, name, PackedLinear(weight, bias))
    on_kernel = sum(isinstance(getattr(owner, name), Bf16Linear) for owner, name in owners)
    rest = "oneDNN" if onednn_packs else f"torch F.linear ({onednn_lacks})"
    if not on_kernel:
        if not onednn_packs:
            return f"torch F.linear ({why}; {onednn_lacks})"
        return f"oneDNN packed ({why if gemm is None else 'packed for oneDNN before'})"
    said = f"{kind.isa_name} ({gemm.isa()})"
    if on_kernel == len(owners):
        return f"{said}, all {on_kernel}"
    return f"{said} for {on_kernel} of {len(owners)}, {rest} for the rest"
