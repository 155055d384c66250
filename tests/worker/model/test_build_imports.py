"""Building a decoder from its weights stays on the cheap side of torch: it does not import
torch._dynamo (and sympy with it). nn.Embedding's own random init, run under the meta device,
did: 2.5 s of every worker's start, for values the checkpoint's replace at once."""

from __future__ import annotations

import subprocess
import sys

BUILD = """
import sys
from intentserve.worker.model.gemma import GemmaModel
from intentserve.worker.model.llama import LlamaModel
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config

for cls, architecture in ((LlamaModel, "llama"), (GemmaModel, "gemma3")):
    config = tiny_config(architecture=architecture, tie_word_embeddings=True)
    model = cls.from_hf_weights(config, random_hf_weights(config))
    assert model.embed_tokens.weight.device.type == "cpu"
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


def test_building_a_decoder_imports_no_compiler():
    out = subprocess.run(
        [sys.executable, "-c", BUILD], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
