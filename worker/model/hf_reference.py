"""The correctness oracle: transformers' own implementation built from the same weights.

For tests and benchmarks only: it needs `transformers` (the `test` extra), which serving does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from intentserve.worker.model.config import ModelConfig, RopeScalingType
from torch import Tensor
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)


def hf_rope_parameters(config: ModelConfig) -> dict:
    scaling = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    params = {
        "rope_type": scaling.type.value,
        "rope_theta": config.rope_theta,
        "factor": scaling.factor,
    }
    if scaling.type is RopeScalingType.LLAMA3:
        params |= {
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    return params


def hf_model(config: ModelConfig, weights: Mapping[str, Tensor]) -> torch.nn.Module:
    """A float32 transformers CausalLM of our config, loaded with exactly these weights."""
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=hf_rope_parameters(config),
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=list(config.eos_token_ids) or None,
        pad_token_id=None,
    )
    if config.architecture == "gemma3":
        model = Gemma3ForCausalLM(_gemma3_config(config, common))
    elif config.architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif config.architecture == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=config.sliding_window))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, attention_bias=config.qkv_bias))
    model.load_state_dict(dict(weights), strict=not config.tie_word_embeddings)
    return model.float().eval()


def _gemma3_config(config: ModelConfig, common: dict) -> Gemma3TextConfig:
    rope = hf_rope_parameters(config)
    local_rope = {"rope_type": "default", "rope_theta": config.rope_local_theta}
    layer_types = [
        "full_attention" if w is None else "sliding_attention" for w in config.layer_windows
    ]
    return Gemma3TextConfig(
        **(common | {"rope_parameters": {"full_attention": rope, "sliding_attention": local_rope}}),
        sliding_window=config.sliding_window,
        layer_types=layer_types,
        query_pre_attn_scalar=config.query_pre_attn_scalar or config.head_dim,
        hidden_activation="gelu_pytorch_tanh",
    )


def hf_model_from_gguf(path: Path) -> torch.nn.Module:
    """A float32 transformers CausalLM as transformers itself reads a GGUF file: its own config
    mapping, dequantization and tensor renaming (an oracle independent of our loader).

    NOTE: built without accelerate (which `from_pretrained(gguf_file=...)` insists on) and
    without random initialisation, since every weight is then replaced.
    """
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # transformers reads the file twice (its config, then its tensors), and each GGUFReader
    # parses every metadata field in Python: 38 s of Gemma 3's 262k-token vocabulary each time
    # (cProfile). The second read gets the first's reader: the same fields, the same memmap.
    real_reader, readers = gguf.GGUFReader, {}

    def read_once(file, *args, **kwargs):
        key = (str(file), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(file, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = read_once
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    finally:
        gguf.GGUFReader = real_reader
    tensors = loaded["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"transformers' GGUF reading left {missing} missing, {unexpected} extra")
    model.tie_weights()
    return model.float().eval()


@torch.inference_mode()
def hf_logits(model: torch.nn.Module, token_ids: list[int]) -> Tensor:  # [T, vocab] float32
    return model(torch.tensor([token_ids])).logits[0].float()
