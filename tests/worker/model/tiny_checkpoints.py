"""Tiny random checkpoints written to disk in Hugging Face and GGUF form, for loader tests."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import tokenizers
import torch
from intentserve.worker.model.config import ModelConfig, RopeScaling, RopeScalingType
from safetensors.torch import save_file
from tokenizers import decoders, models, pre_tokenizers, trainers
from torch import Tensor

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Hello world! Numbers 0123456789 and café, naïve, 東京.",
    "def add(a, b):\n    return a + b\n",
]


def tiny_tokenizer() -> tokenizers.Tokenizer:
    """Byte-level BPE (GPT-2 pre-tokenizer), trained here on a few sentences."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    return tok


# A thinking model's template, as Qwen3's: earlier replies' thinking is left out of the prompt,
# and the generation prompt opens the thinking itself.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'].split('</think>')[-1] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def thinking_tokenizer() -> tokenizers.Tokenizer:
    """tiny_tokenizer with `<think>` and `</think>` as tokens that decoding keeps."""
    tok = tiny_tokenizer()
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    return tok


def write_thinking_folder(folder: Path, seed: int = 0) -> Path:
    """A tiny random-weight Llama whose template and vocabulary make it a thinking model."""
    tokenizer = thinking_tokenizer()
    config = tiny_config(vocab_size=tokenizer.get_vocab_size())
    weights = random_hf_weights(config, seed)
    return write_hf_folder(
        folder, config, weights, tokenizer=tokenizer, chat_template=THINKING_TEMPLATE
    )


def tiny_config(architecture: str = "llama", **overrides) -> ModelConfig:
    config = ModelConfig(
        architecture=architecture,
        vocab_size=tiny_tokenizer().get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        qkv_bias=architecture == "qwen2",
        bos_token_id=1,
        eos_token_ids=(2,),
    )
    if architecture == "gemma3":
        # Six layers, so the file's fixed pattern (every 6th layer global) has one global layer;
        # a band of 5 tokens, shorter than the test prompts.
        config = replace(
            config,
            num_layers=6,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
            sliding_window=5,
            global_layer_interval=6,
            rope_local_theta=10000.0,
            query_pre_attn_scalar=config.head_dim,
        )
    return replace(config, **overrides)


def random_hf_weights(config: ModelConfig, seed: int = 0) -> dict[str, Tensor]:
    """transformers LlamaForCausalLM / Qwen2ForCausalLM / Gemma3ForCausalLM state dict with
    random float32 values."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    h, q, kv = (
        config.hidden_size,
        config.num_heads * config.head_dim,
        config.num_kv_heads * config.head_dim,
    )
    w = {"model.embed_tokens.weight": rand(config.vocab_size, h), "model.norm.weight": 1 + rand(h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": 1 + rand(h),
            p + "post_attention_layernorm.weight": 1 + rand(h),
            p + "self_attn.q_proj.weight": rand(q, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(config.intermediate_size, h),
            p + "mlp.up_proj.weight": rand(config.intermediate_size, h),
            p + "mlp.down_proj.weight": rand(h, config.intermediate_size),
        }
        if config.architecture == "gemma3":  # norms weigh 1 + w there: w near 0
            w |= {
                p + "pre_feedforward_layernorm.weight": rand(h),
                p + "post_feedforward_layernorm.weight": rand(h),
                p + "self_attn.q_norm.weight": rand(config.head_dim),
                p + "self_attn.k_norm.weight": rand(config.head_dim),
            }
        if config.qkv_bias:
            w |= {
                p + f"self_attn.{n}_proj.bias": rand(s) for n, s in (("q", q), ("k", kv), ("v", kv))
            }
    if not config.tie_word_embeddings:
        w["lm_head.weight"] = rand(config.vocab_size, h)
    return w


def hf_config_json(config: ModelConfig) -> dict:
    """config.json of the transformers model with this ModelConfig."""
    hf_arch = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "mistral": "MistralForCausalLM",
    }[config.architecture]
    rope = {"rope_type": "default"}
    if config.rope_scaling is not None:
        from intentserve.worker.model.hf_reference import hf_rope_parameters

        rope = hf_rope_parameters(config)
    return {
        "architectures": [hf_arch],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope,
        "hidden_act": "silu",
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids),
        "sliding_window": config.sliding_window,
    }


def write_hf_folder(
    folder: Path,
    config: ModelConfig,
    weights: dict[str, Tensor],
    num_shards: int = 1,
    *,
    tokenizer: tokenizers.Tokenizer | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_json(config)))
    names = sorted(weights)
    shards = [names[i::num_shards] for i in range(num_shards)]
    weight_map = {}
    for n, shard in enumerate(shards):
        file = f"model-{n + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({k: weights[k].contiguous() for k in shard}, str(folder / file))
        weight_map |= {k: file for k in shard}
    if num_shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tokenizer or tiny_tokenizer()).save(str(folder / "tokenizer.json"))
    tok_config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return folder


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    # What llama.cpp's convert_hf_to_gguf.py does to Q and K rows of llama-arch models
    # (LlamaModel.permute), so the test GGUF has the same layout as real files.
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",  # Phi-3: its fused gate|up goes by llama.cpp's `ffn_up`
}
_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


_GGUF_GEMMA3_LAYER = _GGUF_LAYER | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def _gguf_name(hf_name: str, arch: str) -> str:
    if hf_name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf_name]
    _, _, layer, *part, kind = hf_name.split(".")
    names = _GGUF_GEMMA3_LAYER if arch == "gemma3" else _GGUF_LAYER
    return f"blk.{layer}.{names['.'.join(part)]}.{kind}"


def llama_cpp_rope_freqs(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """The `rope_freqs.weight` divisors llama.cpp's converter writes for `llama3` scaling,
    computed here per pair from its wavelength (independently of the loader's rope.py)."""
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(scaling.factor)
        else:
            smooth = (
                scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor
            ) / (scaling.high_freq_factor - scaling.low_freq_factor)
            factors.append(1 / ((1 - smooth) / scaling.factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(
    path: Path,
    config: ModelConfig,
    weights: dict[str, Tensor],
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """A float32 GGUF laid out as llama.cpp's converter would write it; `extra_tensors` are
    added under their GGUF names as they are."""
    arch = config.architecture
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    if config.head_dim != config.hidden_size // config.num_heads:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    if config.sliding_window is not None:
        writer.add_sliding_window(config.sliding_window)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    scaling = config.rope_scaling
    if scaling is not None and scaling.type is RopeScalingType.LLAMA3:
        freqs = llama_cpp_rope_freqs(config.head_dim, config.rope_theta, scaling)
        writer.add_tensor("rope_freqs.weight", freqs)
    elif scaling is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling.factor)
    writer.add_vocab_size(config.vocab_size)
    if arch == "gemma3":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
    tok = json.loads(tiny_tokenizer().to_str())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    )
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_ids[0])
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, value in weights.items():
        array = value.numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in name:
            array = llama_cpp_permute(array, config.num_heads)
        elif arch == "llama" and ".k_proj." in name:
            array = llama_cpp_permute(array, config.num_kv_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        writer.add_tensor(_gguf_name(name, arch), array)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
