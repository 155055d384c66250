"""Load a Hugging Face checkpoint folder: config.json, *.safetensors, tokenizer.json."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import tokenizers
import torch
from intentserve.worker.model.config import ModelConfig, RopeScaling
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.tokenizer import Tokenizer
from safetensors.torch import load_file
from torch import Tensor

# `architectures[0]` -> the name this package gives the decoder family.
DECODER_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
}
# Families whose sliding window (when set) bands every layer alike; Qwen2/3 name theirs per layer.
_WHOLE_MODEL_SLIDING_WINDOW = frozenset({"mistral", "phi3"})
# Encoder-only families: no causal decoding, hence no KV cache. Reported, never built.
ENCODER_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "albert", "camembert"}
)


def load_hf_folder(
    folder: Path | str, dtype: torch.dtype, device: torch.device | str
) -> LoadedModel:
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(folder, "no such folder")
    try:
        raw = _read_json(folder / "config.json")
        if raw is None:
            raise ValueError("config.json is missing")
        architecture = (raw.get("architectures") or [raw.get("model_type", "?")])[0]
        if raw.get("model_type") in ENCODER_MODEL_TYPES:
            return encoder_facts(folder, architecture, raw, dtype)
        if architecture not in DECODER_ARCHITECTURES:
            raise ValueError(
                f"architecture {architecture!r} is not supported "
                f"(supported: {sorted(DECODER_ARCHITECTURES)} "
                f"and encoder-only {sorted(ENCODER_MODEL_TYPES)})"
            )
        tokenizer = _folder_tokenizer(folder, raw)
        config = replace(
            decoder_config(DECODER_ARCHITECTURES[architecture], raw),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_ids=tokenizer.eos_token_ids,
        )
        model = LlamaModel.from_hf_weights(config, _read_safetensors(folder), dtype, device)
    except KeyError as exc:
        raise ModelLoadError(folder, f"field {exc} is missing") from exc
    except (ValueError, OSError) as exc:
        raise ModelLoadError(folder, str(exc)) from exc
    return LoadedModel(
        config=config,
        model=model,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        source_path=folder,
        dtype=dtype,
    )


def decoder_config(family: str, raw: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Llama / Mistral / Qwen2 / Qwen3 / Phi-3 `config.json`.

    ValueError if the checkpoint needs a feature this decoder does not have. BOS/EOS are left to
    the tokenizer, which merges all their sources.
    """
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported (supported: 'silu')")
    if raw.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported")
    if family in ("qwen2", "qwen3") and raw.get("use_sliding_window"):
        raise ValueError(f"{family} per-layer sliding window (use_sliding_window) is not supported")
    # transformers >= 5 nests theta and scaling in `rope_parameters`; older files keep them flat.
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    partial_rotary = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial_rotary != 1.0:
        raise ValueError(
            f"partial_rotary_factor {partial_rotary} is not supported (only 1.0: RoPE on every dim)"
        )
    num_heads = raw["num_attention_heads"]
    return ModelConfig(
        architecture=family,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        max_position_embeddings=raw["max_position_embeddings"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=RopeScaling.from_hf(rope),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        # Qwen2 always has q/k/v biases; Llama only when `attention_bias` says so.
        qkv_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        sliding_window=raw.get("sliding_window") if family in _WHOLE_MODEL_SLIDING_WINDOW else None,
    )


def encoder_facts(
    folder: Path, architecture: str, raw: dict[str, Any], dtype: torch.dtype
) -> LoadedModel:
    """An encoder's facts for the policy layer: its shape, no KV cache, and no model built."""
    num_heads = raw["num_attention_heads"]
    config = ModelConfig(
        architecture=architecture,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=raw["hidden_size"] // num_heads,
        max_position_embeddings=raw["max_position_embeddings"],
        has_kv_cache=False,
    )
    has_tokenizer = (folder / "tokenizer.json").is_file()
    return LoadedModel(
        config=config,
        model=None,
        tokenizer=_folder_tokenizer(folder, raw) if has_tokenizer else None,
        chat_template=None,
        source_path=folder,
        dtype=dtype,
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name} is not valid JSON ({exc})") from exc


def _read_safetensors(folder: Path) -> dict[str, Tensor]:
    index = _read_json(folder / "model.safetensors.index.json")
    if index is not None:
        files = sorted({folder / name for name in index["weight_map"].values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError("no *.safetensors weights (other weight formats are not supported)")
    weights: dict[str, Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{file.name} is not a readable safetensors file ({exc})") from exc
    return weights


def folder_tokenizer(folder: Path) -> Tokenizer | None:
    """A decoder folder's tokenizer without its weights; None for an encoder's."""
    try:
        raw = _read_json(folder / "config.json") or {}
        if raw.get("model_type") in ENCODER_MODEL_TYPES:
            return None
        return _folder_tokenizer(folder, raw)
    except ValueError as exc:
        raise ModelLoadError(folder, str(exc)) from exc


def _folder_tokenizer(folder: Path, raw_config: dict[str, Any]) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ValueError("tokenizer.json is missing")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers reports parse errors as plain Exception
        raise ValueError(f"tokenizer.json is not readable ({exc})") from exc
    tok_config = _read_json(folder / "tokenizer_config.json") or {}
    generation = _read_json(folder / "generation_config.json") or {}

    def token_id(entry: Any) -> int | None:
        # tokenizer_config stores a token as its text or as {"content": text, ...}.
        text = entry.get("content") if isinstance(entry, dict) else entry
        return None if text is None else backend.token_to_id(text)

    bos_token_id = raw_config.get("bos_token_id", token_id(tok_config.get("bos_token")))
    eos_token_ids: list[int] = []
    for source in (
        raw_config.get("eos_token_id"),
        generation.get("eos_token_id"),
        token_id(tok_config.get("eos_token")),
    ):
        for value in source if isinstance(source, list) else [source]:
            if value is not None and value not in eos_token_ids:
                eos_token_ids.append(value)
    add_bos = tok_config.get("add_bos_token")
    if add_bos is None:
        # No explicit flag: the tokenizer's post-processor adds BOS or it does not (Llama 3 style).
        add_bos = bos_token_id is not None and backend.encode("").ids[:1] == [bos_token_id]
    return Tokenizer(
        backend,
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        add_bos_token=bool(add_bos),
        chat_template=_chat_template(folder, tok_config),
    )


def _chat_template(folder: Path, tok_config: dict[str, Any]) -> str | None:
    standalone = folder / "chat_template.jinja"
    if standalone.is_file():
        return standalone.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template
