"""`weights: native`: a loaded GGUF model's projections, LM head and embedding table replaced by
the file's own blocks (gguf_linear.py), in place, as `quantize_linears` replaces them for int8.

Which tensors: a projection whose GGUF tensors are all of a type native holds (NATIVE_TYPES) is
held as they are, each part in its own type; one with any other part (F16, F32, BF16, Q5_0, Q2_K,
...) stays dequantized, as loaded. The embedding table and the LM head (the table again where it
is tied: one copy of the blocks serves both) follow the same rule. A model none of whose
projections can be held, or one that is not a GGUF file, is refused: `NativeWeightsError` names
the file, or the first projection tensor and its type.

NOTE: the float model is loaded first and its layers replaced one by one (a start-up peak of
the dequantized size, then the file's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from intentserve.worker.kernels import GgufGemm
from intentserve.worker.model.gguf_linear import (
    NATIVE_TYPES,
    GgufBlocks,
    NativeEmbedding,
    NativeLinear,
    interleave,
)
from intentserve.worker.model.gguf_loader import open_gguf, undo_rope_permutation
from intentserve.worker.model.loaded import LoadedModel

_HELD_NAMES = ", ".join(q.name for q in NATIVE_TYPES)


class NativeWeightsError(ValueError):
    """The model cannot be held as its file's blocks; the message names the file or tensor."""


@dataclass(frozen=True)
class NativeHolding:
    """What `hold_native` did: GGUF tensors held per type, and those dequantized, per type."""

    held: dict[str, int]
    dequantized: dict[str, int]

    def describe(self) -> str:
        def counts(c: dict[str, int]) -> str:
            return ", ".join(f"{n} {t}" for t, n in sorted(c.items())) or "none"

        held, dequantized = counts(self.held), counts(self.dequantized)
        return f"tensors held as in the file: {held}; dequantized: {dequantized}"


def _projection_tensors(arch: str, layer: int) -> dict[tuple[str, str], tuple[str, ...]]:
    """(owner, attribute) of each projection of a layer -> its GGUF tensors, in fused order."""
    blk = f"blk.{layer}"
    qkv = (f"{blk}.attn_q.weight", f"{blk}.attn_k.weight", f"{blk}.attn_v.weight")
    gate_up = (f"{blk}.ffn_gate.weight", f"{blk}.ffn_up.weight")
    if arch == "phi3":  # q|k|v and gate|up each one tensor in the file
        qkv, gate_up = (f"{blk}.attn_qkv.weight",), (f"{blk}.ffn_up.weight",)
    return {
        ("self_attn", "qkv_proj"): qkv,
        ("self_attn", "o_proj"): (f"{blk}.attn_output.weight",),
        ("mlp", "gate_up_proj"): gate_up,
        ("mlp", "down_proj"): (f"{blk}.ffn_down.weight",),
    }


def hold_native(loaded: LoadedModel, kernel: GgufGemm) -> NativeHolding:
    """Replace what the file's blocks can hold; returns the counts. Raises NativeWeightsError."""
    path = Path(loaded.source_path)
    if path.suffix != ".gguf" or not path.is_file():
        raise NativeWeightsError(
            f"native keeps a GGUF file's own blocks; {path} is not a .gguf file (use "
            f"dequantized, int8, int4 or w8a8 for it)"
        )
    f, model, config = open_gguf(path), loaded.model, loaded.config
    tensors = {name: f.stored(name) for name in f.tensor_names}
    held: Counter[str] = Counter()
    dequantized: Counter[str] = Counter()

    def blocks(name: str) -> GgufBlocks:
        t = tensors[name]
        cols, rows = int(t.shape[0]), int(np.prod(t.shape[1:]))
        data = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(rows, -1))
        return GgufBlocks(t.tensor_type, undo_rope_permutation(data, name, config), cols)

    def holdable(names: tuple[str, ...]) -> bool:
        types = [tensors[n].tensor_type for n in names]
        (held if all(t in NATIVE_TYPES for t in types) else dequantized).update(
            t.name for t in types
        )
        return all(t in NATIVE_TYPES for t in types)

    first_refused = ""
    for i, layer in enumerate(model.layers):
        for (owner_name, attr), names in _projection_tensors(config.architecture, i).items():
            owner = getattr(layer, owner_name)
            if not holdable(names):
                bad = next(n for n in names if tensors[n].tensor_type not in NATIVE_TYPES)
                first_refused = first_refused or f"{bad} is {tensors[bad].tensor_type.name}"
                continue
            bias = getattr(owner, attr).bias
            setattr(owner, attr, NativeLinear([blocks(n) for n in names], bias, kernel))
    if not held:
        raise NativeWeightsError(
            f"no projection of {path.name} is of a type native holds ({_HELD_NAMES}): "
            f"{first_refused}"
        )
    dtype = loaded.dtype
    embedding = "token_embd.weight"
    # interleaved here, where it is read as a tied head too: one buffer serves both
    table = interleave(kernel, blocks(embedding)) if holdable((embedding,)) else None
    if table is not None:
        model.embed_tokens = NativeEmbedding(table, kernel, dtype)
    head_name = "output.weight" if "output.weight" in tensors else embedding
    if head_name == embedding and table is not None:
        model.lm_head = NativeLinear([table], None, kernel, torch.float32)
    elif head_name != embedding and holdable((head_name,)):
        model.lm_head = NativeLinear([blocks(head_name)], None, kernel, torch.float32)
    return NativeHolding(dict(held), dict(dequantized))
