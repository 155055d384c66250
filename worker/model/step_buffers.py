"""Kept output buffers for the Python layers of a CPU step (long prefills, and any step the
compiled call does not run).

Each layer's outputs are a few MB at a prefill's thousands of rows (SmolLM2 at 1,568 rows: the
gate|up projection alone is 9.6 MB). Allocated fresh, blocks that size come from new mappings that
the kernel zeroes page by page: a 32-prompt prefill step faulted in ~150,000 pages and spent a
third of its time there (docs/engine.md). Here each output has a role, and every layer writes that
role's output into the same buffer, which only grows: after the first step of a size, a step maps
no new memory.

The roles are chosen so that no buffer is written while what it holds is still to be read: in a
layer, the input norm's output is read by the q|k|v projection before the post-attention norm
writes the same role, and the MLP's output is read by the next layer's norm before that layer's
MLP writes it again. The model's final norm and the LM head keep fresh outputs: what leaves the
layers (hidden states, logits) is never a kept buffer.

Buffers are per thread: a model stepped from two threads (tests do) never shares one.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

# The roles, in the order a decoder layer writes them.
NORM = "norm"  # input and post-attention norms' outputs
QKV = "qkv"  # the fused q|k|v projection
ATTENTION_OUT = "o"  # the output projection
GATE_UP = "gate_up"  # the fused gate|up projection
ACTIVATION = "act"  # SiLU(gate) * up
MLP_OUT = "down"  # the down projection: the layer's output

_ALIGN = 64  # bytes; torch's CPU allocator aligns to 64 as well


class StepBuffers:
    """Per-role grow-only buffers; `take` returns a [rows, cols] view of the role's buffer."""

    def __init__(self) -> None:
        self._local = threading.local()

    def take(self, role: str, rows: int, cols: int, dtype: torch.dtype) -> Tensor:
        kept: dict[str, Tensor] = self._local.__dict__.setdefault("kept", {})
        count = rows * cols
        nbytes = count * dtype.itemsize
        buffer = kept.get(role)
        if buffer is None or buffer.numel() < nbytes:
            # Grown by at least a quarter so that slowly rising step sizes do not remap each step.
            size = max(nbytes, 0 if buffer is None else buffer.numel() * 5 // 4)
            buffer = torch.empty(-(-size // _ALIGN) * _ALIGN, dtype=torch.uint8)
            kept[role] = buffer
        return buffer[:nbytes].view(dtype).view(rows, cols)

    def kept_bytes(self) -> int:
        """Bytes this thread keeps."""
        kept = self._local.__dict__.get("kept", {})
        return sum(b.numel() for b in kept.values())


def keep_step_buffers(model) -> bool:
    """Give a Llama-family CPU model's layers kept output buffers; False (nothing changed) for a
    model whose layers are not built that way (Gemma's, an encoder's)."""
    layers = getattr(model, "layers", None)
    if layers is None or type(model).__name__ != "LlamaModel":
        return False
    if model.device.type != "cpu":
        return False
    buffers = StepBuffers()
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.out_buffer = (buffers, NORM)
        mlp.act_buffer = (buffers, ACTIVATION)
        for proj, role in (
            (attention.qkv_proj, QKV),
            (attention.o_proj, ATTENTION_OUT),
            (mlp.gate_up_proj, GATE_UP),
            (mlp.down_proj, MLP_OUT),
        ):
            if hasattr(proj, "out_buffer"):  # the projections that write into a given output
                proj.out_buffer = (buffers, role)
    return True


def out_tensor(
    kept: tuple[StepBuffers, str] | None, rows: int, cols: int, dtype: torch.dtype
) -> Tensor:
    """The role's kept buffer as [rows, cols], or a fresh tensor where there is none."""
    if kept is None:
        return torch.empty((rows, cols), dtype=dtype)
    buffers, role = kept
    return buffers.take(role, rows, cols, dtype)
