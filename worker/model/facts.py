"""A checkpoint's shape read from its metadata alone (GGUF header, `config.json`), no weights.

The capability probe needs it before the worker registers: the controller decides what the worker
must build from these facts, and only then is the model loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from intentserve.policy import ModelFacts
from intentserve.worker.model.config import ModelConfig
from intentserve.worker.model.gguf_loader import gguf_model_config, open_gguf
from intentserve.worker.model.hf_loader import (
    DECODER_ARCHITECTURES,
    ENCODER_MODEL_TYPES,
    decoder_config,
    encoder_facts,
    load_hf_folder,
)
from intentserve.worker.model.loaded import ModelLoadError
from intentserve.worker.model.registry import resolve_model_path

# The longest sequence served by default, whatever longer context the model supports.
DEFAULT_MAX_MODEL_LEN = 2048


def read_model_config(ref: str) -> ModelConfig:
    """The ModelConfig `load_model(ref)` would build; ModelLoadError names the path when the
    checkpoint is missing or unsupported."""
    path = resolve_model_path(ref)
    try:
        if path.is_dir():
            return _folder_config(path)
        return gguf_model_config(open_gguf(path))
    except KeyError as exc:
        raise ModelLoadError(path, f"field {exc} is missing") from exc
    except (ValueError, OSError) as exc:
        raise ModelLoadError(path, str(exc)) from exc


def serving_max_model_len(config: ModelConfig, requested: int | None) -> int:
    """The engine's max_model_len: `requested`, or the model's own limit capped at
    DEFAULT_MAX_MODEL_LEN; ValueError names the field when it is out of the model's range."""
    limit = config.max_position_embeddings
    if requested is None:
        return min(limit, DEFAULT_MAX_MODEL_LEN)
    if not 2 <= requested <= limit:
        raise ValueError(
            f"max_model_len: {requested} is out of range; this model allows 2 to {limit}"
        )
    return requested


def model_facts(config: ModelConfig, max_model_len: int) -> ModelFacts:
    """What the capability report says of the model."""
    return ModelFacts(
        architecture=config.architecture,
        has_kv_cache=config.has_kv_cache,
        head_dim=config.head_dim,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        max_model_len=max_model_len,
    )


def read_model_facts(ref: str, max_model_len: int | None) -> ModelFacts:
    """The facts of `ref` from its metadata alone, sized as the engine builder will size it."""
    config = read_model_config(ref)
    if not config.has_kv_cache:  # an encoder: no sequence length to serve
        return model_facts(config, max_model_len or 0)
    return model_facts(config, serving_max_model_len(config, max_model_len))


def _folder_config(folder: Path) -> ModelConfig:
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raw = {}
    architecture = (raw.get("architectures") or [raw.get("model_type", "?")])[0]
    if raw.get("model_type") in ENCODER_MODEL_TYPES:
        return encoder_facts(folder, architecture, raw, torch.float32).config
    if architecture in DECODER_ARCHITECTURES:
        return decoder_config(DECODER_ARCHITECTURES[architecture], raw)
    # NOTE: anything else the loader itself refuses, naming the problem, before reading weights.
    return load_hf_folder(folder, torch.float32, torch.device("cpu")).config
