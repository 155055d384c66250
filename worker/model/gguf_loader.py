"""Load a llama.cpp GGUF checkpoint: metadata -> ModelConfig, dequantized tensors -> a decoder."""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.kernels import KernelUnavailable, gguf_gemm_kernel
from intentserve.worker.model.config import ModelConfig, RopeScaling, RopeScalingType
from intentserve.worker.model.gemma import GemmaModel
from intentserve.worker.model.gguf_header import GGUFTensor, read_gguf_header
from intentserve.worker.model.gguf_linear import (
    NATIVE_TYPES,
    GgufBlocks,
    GgufGemm,
    dequantize_blocks,
)
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.loaded import DecoderModel, LoadedModel, ModelLoadError
from torch import Tensor

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma3")


def _dequantizable_types() -> tuple[QType, ...]:
    """Every tensor type the installed gguf package can dequantize, asked of gguf itself: it
    raises NotImplementedError for a type it has no dequantizer for (one zero block is cheap)."""
    supported = []
    for qtype in QType:
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
        except NotImplementedError:
            continue
        supported.append(qtype)
    return tuple(supported)


SUPPORTED_TENSOR_TYPES = _dequantizable_types()

# GGUF tensor names -> transformers names (LlamaForCausalLM, Gemma3ForCausalLM).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "self_attn.qkv_proj",  # Phi-3 keeps q|k|v in one tensor
}
# Gemma norms the attention and MLP outputs too; its `ffn_norm` is the pre-MLP norm.
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Gemma 3 specifics llama.cpp does not store in the file (it hard-codes them the same way):
# every 6th layer attends globally, the others locally with RoPE base 10000.
_GEMMA3_GLOBAL_LAYER_INTERVAL = 6
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
# The one Gemma 3 size whose query_pre_attn_scalar is hidden_size / num_heads, not head_dim.
_GEMMA3_27B_NUM_LAYERS = 62
# Phi-3's `ffn_up` is its fused gate|up projection (2 * feed_forward_length rows, no ffn_gate).
_FUSED_GATE_UP_ARCHITECTURES = frozenset({"phi3"})
# Not weights: RoPE frequency divisors, read into the config instead.
ROPE_FREQS_TENSOR = "rope_freqs.weight"
# Phi-3 long-context (LongRoPE / "su") files switch between two factor sets by sequence length.
_LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_NORM = re.compile(r"norm\.weight$")
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def open_gguf(path: Path | str) -> GGUFFile:
    """The parsed file, shared within this process while it is unchanged on disk.

    NOTE: a worker reads the model's facts before registering and loads the weights after;
    this keeps that to one parse of the header (and one memory map).
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return GGUFFile(path)  # raises ModelLoadError naming the path
    return _open_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


def forget_opened() -> None:
    """Drop the files `open_gguf` keeps parsed (a worker, once its engine is built: the
    metadata holds SmolLM2's ~200,000 tokenizer strings and numbers; worker/runtime/heap.py)."""
    _open_cached.cache_clear()


class GGUFFile:
    """An opened GGUF file whose header and tensor extents have been checked."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(self.path, "no such file")
        try:
            # The reader checks the magic, the header and that every tensor's bytes are present.
            header = read_gguf_header(self.path)
        except Exception as exc:  # bad input shows as struct, numpy and Unicode errors too
            raise ModelLoadError(
                self.path,
                f"not a valid GGUF file, truncated or corrupt ({type(exc).__name__}: {exc})",
            ) from exc
        self.metadata: dict[str, Any] = header.metadata
        self._tensors = {t.name: t for t in header.tensors}

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def stored(self, name: str) -> GGUFTensor:
        """The tensor as the file stores it: its type, shape (innermost first) and bytes."""
        return self._tensors[name]

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> Tensor:
        """Dequantized tensor in row-major [rows, cols] order (torch Linear layout), in `dtype`:
        each value is the float32 one, rounded once (the compiled dequantizer writes bfloat16
        itself, so no float32 copy of the tensor is made)."""
        t = self._tensors[name]
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            allowed = [q.name for q in SUPPORTED_TENSOR_TYPES]
            raise ModelLoadError(
                self.path,
                f"tensor {name!r} has type {t.tensor_type.name}, "
                f"not supported (supported: {allowed})",
            )
        kernel = _compiled_dequantizer() if t.tensor_type in NATIVE_TYPES else None
        if kernel is not None:
            return _dequantize_compiled(kernel, t, dtype)
        values = gguf.quants.dequantize(t.data, t.tensor_type)  # float32
        if not values.flags.writeable:  # F32 comes back as a view of the read-only memory map
            values = values.copy()
        return torch.from_numpy(values).to(dtype)


@functools.cache
def _compiled_dequantizer() -> GgufGemm | None:
    """gguf_gemm.c's dequantizer (bit for bit gguf's, tests/worker/model/test_gguf_gemm.py, and
    about 40x faster: SmolLM2's tensors in 0.1 s instead of 3.7), or None where this host cannot
    build or run it; gguf's own numpy dequantizer then reads every type."""
    try:
        return gguf_gemm_kernel()
    except KernelUnavailable:
        return None


def _dequantize_compiled(kernel: GgufGemm, t: GGUFTensor, dtype: torch.dtype) -> Tensor:
    rows, row_bytes = int(np.prod(t.data.shape[:-1])), t.data.shape[-1]
    block_size, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
    cols = row_bytes // type_size * block_size
    data = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(rows, row_bytes))
    written = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32
    values = dequantize_blocks(kernel, GgufBlocks(t.tensor_type, data, cols), written)
    return values.reshape(*t.data.shape[:-1], cols).to(dtype)


def gguf_model_config(f: GGUFFile) -> ModelConfig:
    """BOS/EOS are left to the tokenizer, which knows every end token (eos, eot, eom)."""
    meta = f.metadata
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})"
        )

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"metadata {arch}.{name} is missing")
        return value

    num_heads = int(key("attention.head_count"))
    hidden_size = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden_size // num_heads))
    rotary_dim = int(key("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise ValueError(
            f"partial rotary embedding ({rotary_dim} of {head_dim} dims) is not supported"
        )
    if any(name in f.tensor_names for name in _LONGROPE_TENSORS):
        raise ValueError(
            "LongRoPE scaling (tensors rope_factors_long/rope_factors_short, Phi-3 128k) is not "
            "supported; use the model's short-context (4k) variant"
        )
    vocab_size = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab_size:
        raise ValueError(f"metadata {arch}.vocab_size and tokenizer.ggml.tokens are both missing")
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if meta.get(f"{arch}.{name}") is not None:
            raise ValueError(f"metadata {arch}.{name}: logit soft-capping is not supported")
    config = ModelConfig(
        architecture=arch,
        vocab_size=int(vocab_size),
        hidden_size=hidden_size,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(key("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(f, arch, head_dim),
        tie_word_embeddings="output.weight" not in f.tensor_names,
        qkv_bias="blk.0.attn_q.bias" in f.tensor_names or "blk.0.attn_qkv.bias" in f.tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensor_names,
        sliding_window=_optional_int(meta.get(f"{arch}.attention.sliding_window")),
    )
    if arch != "gemma3":
        return config
    if config.sliding_window is None:
        raise ValueError("metadata gemma3.attention.sliding_window is missing")
    return replace(
        config,
        global_layer_interval=_GEMMA3_GLOBAL_LAYER_INTERVAL,
        rope_local_theta=_GEMMA3_LOCAL_ROPE_THETA,
        query_pre_attn_scalar=(
            hidden_size // num_heads if config.num_layers == _GEMMA3_27B_NUM_LAYERS else head_dim
        ),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _rope_scaling(f: GGUFFile, arch: str, head_dim: int) -> RopeScaling | None:
    meta = f.metadata
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in ("none", "linear"):
        raise ValueError(f"RoPE scaling {kind!r} is not supported (supported: 'linear')")
    # Older files carry only `rope.scale_linear`; llama.cpp applies any factor but YaRN's linearly.
    factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear"))
    linear = factor is not None and factor != 1.0
    if ROPE_FREQS_TENSOR in f.tensor_names:
        if linear:
            raise ValueError(
                f"both {ROPE_FREQS_TENSOR!r} and linear RoPE scaling are set; "
                "llama.cpp files use one or the other"
            )
        return _freq_factors(f, head_dim)
    if not linear:
        return None
    return RopeScaling(type=RopeScalingType.LINEAR, factor=float(factor))


def _freq_factors(f: GGUFFile, head_dim: int) -> RopeScaling:
    """Llama 3.1/3.2 files: llama.cpp's converter turns the `llama3` recipe (config.json's
    `rope_scaling`) into one divisor per rotary pair; the tensor is the exact recipe, whatever
    the `rope.scaling.*` keys say (its converter writes none for it)."""
    factors = f.tensor(ROPE_FREQS_TENSOR).flatten()
    if factors.numel() != head_dim // 2:
        raise ValueError(
            f"{ROPE_FREQS_TENSOR!r} has {factors.numel()} values; "
            f"expected head_dim / 2 = {head_dim // 2}"
        )
    return RopeScaling(
        type=RopeScalingType.FREQ_FACTORS, factor=1.0, freq_factors=tuple(factors.tolist())
    )


def gguf_hf_weights(
    f: GGUFFile, config: ModelConfig, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """All tensors, dequantized and named as in transformers' LlamaForCausalLM.

    Each is dequantized straight into `dtype` (a norm weight in float32 first: Gemma's is
    rewritten before its one rounding), so no float32 copy of the model is made.
    """
    return {
        _hf_name(name, config.architecture): _to_hf_layout(
            f.tensor(name, torch.float32 if _NORM.search(name) else dtype), name, config
        ).to(dtype)
        for name in f.tensor_names
        if name != ROPE_FREQS_TENSOR
    }


def _hf_name(gguf_name: str, arch: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in names:
        raise ValueError(f"unexpected tensor {gguf_name!r}")
    layer, part, kind = match.groups()
    if part == "ffn_up" and arch in _FUSED_GATE_UP_ARCHITECTURES:
        return f"model.layers.{layer}.mlp.gate_up_proj.{kind}"
    return f"model.layers.{layer}.{names[part]}.{kind}"


def _to_hf_layout(w: Tensor, gguf_name: str, config: ModelConfig) -> Tensor:
    if config.architecture == "gemma3" and gguf_name.endswith("norm.weight"):
        # llama.cpp's converter stores Gemma's norm weights as 1 + w (its RMSNorm multiplies by
        # the weight); transformers keeps w and adds the 1 when it applies the norm.
        return w - 1.0
    return undo_rope_permutation(w, gguf_name, config)


def undo_rope_permutation(w: Tensor, gguf_name: str, config: ModelConfig) -> Tensor:
    """llama.cpp's converter reorders each head's Q/K rows from rotate-half pairs (i, i + D/2)
    to adjacent pairs (2i, 2i + 1) for its interleaved RoPE; put them back for rotate-half.

    Only the `llama` architecture is permuted; llama.cpp runs qwen2/qwen3/phi3 with rotate-half
    RoPE.
    """
    if config.architecture != "llama":
        return w
    if ".attn_q." in gguf_name:
        num_heads = config.num_heads
    elif ".attn_k." in gguf_name:
        num_heads = config.num_kv_heads
    else:
        return w
    rest = w.shape[1:]
    # [H, D/2, 2, ...] (row 2i + j) -> [H, 2, D/2, ...] (row j * D/2 + i)
    return w.reshape(num_heads, config.head_dim // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def build_gguf_decoder(
    f: GGUFFile, config: ModelConfig, dtype: torch.dtype, device: torch.device | str
) -> DecoderModel:
    """The decoder of `config.architecture` with the file's weights (no tokenizer needed)."""
    decoder = GemmaModel if config.architecture == "gemma3" else LlamaModel
    return decoder.from_hf_weights(config, gguf_hf_weights(f, config, dtype), dtype, device)


def load_gguf(path: Path | str, dtype: torch.dtype, device: torch.device | str) -> LoadedModel:
    f = open_gguf(path)
    try:
        tokenizer = build_gguf_tokenizer(f.metadata)
        config = replace(
            gguf_model_config(f),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_ids=tokenizer.eos_token_ids,
        )
        model = build_gguf_decoder(f, config, dtype, device)
    except KeyError as exc:
        raise ModelLoadError(f.path, f"metadata {exc} is missing") from exc
    except ValueError as exc:
        raise ModelLoadError(f.path, str(exc)) from exc
    return LoadedModel(
        config=config,
        model=model,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        source_path=f.path,
        dtype=dtype,
    )
