"""What a loader hands back, and the one error every loader raises."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from intentserve.worker.model.config import ModelConfig
from intentserve.worker.model.gemma import GemmaModel
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.tokenizer import Tokenizer

# The decoders: one interface (forward over a varlen batch, compute_logits, from_hf_weights).
DecoderModel = LlamaModel | GemmaModel


class ModelLoadError(Exception):
    """A checkpoint could not be loaded; the message names the path and what is wrong."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"cannot load model {str(path)!r}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint made ready to serve.

    NOTE: `model` is None exactly when `config.has_kv_cache` is False (an encoder-only
    checkpoint): the loader reports its facts and leaves the decision to the policy layer.
    """

    config: ModelConfig
    model: DecoderModel | None
    tokenizer: Tokenizer | None
    chat_template: str | None
    source_path: Path
    dtype: torch.dtype
