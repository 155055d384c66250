"""What Python hands the one-call decode step (worker/kernels/layers/decode_step.h): ctypes
structures of the C layout, field for field, and each projection's part of them."""

from __future__ import annotations

import ctypes

import torch
from intentserve.worker.model.gguf_linear import NativeLinear
from intentserve.worker.model.packed_linear import Bf16Linear, F32Linear
from intentserve.worker.model.quant_linear import W8A8Linear
from torch import Tensor

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class Kernels(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("add_rmsnorm", "gemm", "rotary", "kv_store", "decode")]
    _fields_ += [("silu_mul", _P), ("w8a8_linear", _P)]
    _fields_ += [("gguf_quantize", _P), ("gguf_gemm", _P), ("gguf_dequantize", _P)]
    _fields_ += [("gemma_norm", _P), ("qk_norm_rotary", _P), ("gelu_mul", _P)]


class Dims(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim")),
        ("intermediate", _I64),
        ("block_size", _I64),
        ("eps", _F32),
        ("scale", _F32),
        ("projections", _I64),
        ("elem_bytes", _I64),
        ("q_multiplier", _F32),
    ]


# decode_step.h's enum projections, by `kind`
PROJECTIONS = {"gemm": 0, "w8a8": 1, "native": 2}


class Ends(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("input_ids", "positions", "embed", "final_norm")]
    _fields_ += [(name, _P) for name in ("cos", "sin", "cos_local", "sin_local")]
    _fields_ += [("vocab", _I64), ("max_pos", _I64)]
    _fields_ += [("embed_type", _I64), ("embed_interleaved", _I64), ("embed_scale", _F32)]


class GgufPart(ctypes.Structure):
    _fields_ = [("blocks", _P), ("type", _I64), ("rows", _I64), ("interleaved", _I64)]


class Proj(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("weight", "bias_or_comp", "scales", "inv_smooth")]
    _fields_ += [("gemm_flags", _I64), ("parts", ctypes.POINTER(GgufPart)), ("num_parts", _I64)]


class Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _P),
        ("post_norm", _P),
        *((name, Proj) for name in ("qkv", "o", "gate_up", "down")),
        ("k_cache", _P),
        ("v_cache", _P),
        ("window", _I64),
        *((name, _P) for name in ("pre_ff_norm", "post_ff_norm", "q_norm", "k_norm")),
        ("local_rope", _I64),
    ]


def ptr(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def proj(module, keep: list) -> Proj:
    """The projection's struct; a NativeLinear's array of parts goes into `keep`, which must
    outlive the struct."""
    if isinstance(module, NativeLinear):
        parts = [
            GgufPart(part.data.data_ptr(), part.qtype.value, part.rows, int(part.interleaved))
            for part in module.parts
        ]
        keep.append((GgufPart * len(parts))(*parts))
        return Proj(None, None, None, None, 0, keep[-1], len(parts))
    if isinstance(module, W8A8Linear):
        return Proj(
            module.packed.data_ptr(),
            module.comp.data_ptr(),
            module.scales.data_ptr(),
            ptr(module.inv_smooth),
            0,
        )
    return Proj(module.packed.data_ptr(), ptr(module.bias), None, None, module.gemm_flags)


def kind(module) -> str:
    """ "gemm" (the dtype's GEMM kernel), "w8a8" or "native" (GGUF blocks) where the projection
    runs on a kernel the call can drive, else ""."""
    if isinstance(module, NativeLinear) and module.bias is None and module.out_dtype is None:
        return "native"
    if isinstance(module, F32Linear):
        return "gemm"
    if isinstance(module, Bf16Linear) and module.out_dtype == torch.bfloat16:
        return "gemm"
    if isinstance(module, W8A8Linear) and module.gemm is not None and module.bias is None:
        return "w8a8"
    return ""


def address(fn) -> int:
    return ctypes.cast(fn, _P).value
