"""The model: config, Llama-family decoder, loaders (GGUF, Hugging Face folder), tokenizer."""

from worker.model.config import ModelConfig, RopeScaling, RopeScalingType
from worker.model.loaded import LoadedModel, ModelLoadError
from worker.model.registry import load_model, resolve_model_path

__all__ = [
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "RopeScaling",
    "RopeScalingType",
    "load_model",
    "resolve_model_path",
]
