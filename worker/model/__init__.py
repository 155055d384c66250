"""The model: config, Llama-family decoder, loaders (GGUF, Hugging Face folder), tokenizer."""

from intentserve.worker.model.config import ModelConfig, RopeScaling, RopeScalingType
from intentserve.worker.model.loaded import LoadedModel, ModelLoadError
from intentserve.worker.model.registry import load_model, resolve_model_path

__all__ = [
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "RopeScaling",
    "RopeScalingType",
    "load_model",
    "resolve_model_path",
]
