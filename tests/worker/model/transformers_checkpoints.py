"""Tiny random checkpoints written by transformers itself (`save_pretrained`), so the folder a
test loads is exactly what a user downloads: transformers' names, fusions and config fields."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tiny_checkpoints import CHAT_TEMPLATE, tiny_tokenizer
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

_SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
# Each family with the feature that sets it apart from Llama switched on.
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral-sliding-window": (MistralConfig, MistralForCausalLM, {"sliding_window": 16}),
    # head_dim 32 != hidden / heads (16): Qwen3 states it explicitly.
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32}),
    "phi3": (Phi3Config, Phi3ForCausalLM, {}),
    "phi3-sliding-window": (Phi3Config, Phi3ForCausalLM, {"sliding_window": 16}),
}


def tiny_transformers_model(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A float32 transformers CausalLM with random weights of a scale that gives decided argmaxes.

    NOTE: transformers' own init (std 0.02, norms at 1) makes near-uniform logits, where greedy
    ties would test rounding, not the model; norms get 1 + noise so their weights matter.
    """
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(
        vocab_size=tiny_tokenizer().get_vocab_size(), **_SHAPE, **extra, **overrides
    )
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.2 * torch.randn_like(param))
    return model


def save_checkpoint(model: torch.nn.Module, folder: Path) -> Path:
    """save_pretrained (safetensors) plus the tokenizer files a Hub folder carries."""
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save(str(folder / "tokenizer.json"))
    tok_config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder
