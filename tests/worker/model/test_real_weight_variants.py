"""Every load path on SmolLM2's real weights: an HF safetensors folder and GGUF files of five
tensor types, derived from the packaged file at test time (smollm2_variants.py), each checked
two ways through `load_model` and the engine:

- exactly: its logits equal those of the original model given the same rounded weights, so the
  loader adds nothing but the format's own rounding (names, layout, block order all right);
- against the dequantized original: how far that rounding moves the logits and the greedy
  tokens, with thresholds set from measurements (figures below) and what a broken load gives.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.gguf_loader import SUPPORTED_TENSOR_TYPES
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.reference_attention import reference_logits
from intentserve.worker.model.registry import load_model
from smollm2_variants import rounded

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a land far away, there lived a dragon who loved 42 kinds of cheese.",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
]
NUM_NEW_TOKENS = 16


# Measured on this machine (float32, 97 prompt positions, 4 prompts x 16 greedy tokens):
#   variant  max|logit diff|  argmax agreement  greedy tokens equal  first differing greedy token
#   hf       0                1.000             64/64                none
#   F16      0.035            1.000             64/64                none
#   Q8_0     1.06             1.000             64/64                none
#   BF16     0.20             1.000             61/64                2 (one prompt)
#   Q6_K     3.07             0.922             63/64                8 (one prompt)
#   Q4_0     18.9             0.641             11/64                0 (Q4_1 weights requantized)
# The argmax agreement (each position given the original's prefix) is the measure of a lossy
# format: a broken load (layout, block order, names) agrees at ~0 positions. A free-running
# continuation follows the first near-tie it meets (BF16 moves logits by up to 0.2) and then
# differs for reasons of its own: it must be identical only where the rounding is far below the
# gaps measured here; Q4_0's (twice-quantized, 135M parameters) is reported, not asserted.
# name -> (max |logit diff|, min argmax agreement, min share of greedy tokens equal)
TOLERANCES = {
    "hf": (1e-5, 1.0, 1.0),
    "F16": (0.1, 1.0, 1.0),
    "Q8_0": (2.5, 1.0, 1.0),
    "BF16": (0.5, 1.0, 0.75),
    "Q6_K": (6.0, 0.85, 0.75),
    "Q4_0": (40.0, 0.5, 0.0),
}


def _engine_tokens(loaded) -> list[list[int]]:
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=32 << 20)
        .scheduler(max_model_len=256, max_num_seqs=4)
        .build(loaded=loaded)
    )
    greedy = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    return [list(o.new_token_ids) for o in engine.generate(PROMPTS, greedy)]


@pytest.fixture(scope="module")
def original(smollm2):
    """The packaged file dequantized to float32: token ids, logits and greedy tokens."""
    ids = [smollm2.tokenizer.encode(p) for p in PROMPTS]
    logits = [reference_logits(smollm2.model, i) for i in ids]
    return ids, logits, _engine_tokens(load_model("smollm2-135m", dtype="float32"))


def _same_rounding_logits(smollm2, name: str, ids: list[list[int]]) -> list[torch.Tensor]:
    """The original model given the weights exactly as the variant stores them."""
    if name == "hf":
        weights = smollm2.weights
    else:
        qtype = QType[name]
        weights = {
            k: torch.from_numpy(rounded(v.numpy(), qtype)) for k, v in smollm2.weights.items()
        }
    model = LlamaModel.from_hf_weights(smollm2.config, weights, torch.float32)
    return [reference_logits(model, i) for i in ids]


@pytest.mark.parametrize("name", list(TOLERANCES))
def test_variant_loads_exactly_and_near_the_original(smollm2_variants, smollm2, original, name):
    if name == "Q6_K" and QType.Q6_K not in SUPPORTED_TENSOR_TYPES:
        pytest.skip("the loader does not read Q6_K yet (SUPPORTED_TENSOR_TYPES, branch wt-gemma)")
    ids, expected, expected_tokens = original
    loaded = load_model(str(smollm2_variants[name]), dtype="float32")
    assert [loaded.tokenizer.encode(p) for p in PROMPTS] == ids
    got = [reference_logits(loaded.model, i) for i in ids]

    exact = _same_rounding_logits(smollm2, name, ids)
    assert max((g - e).abs().max().item() for g, e in zip(got, exact, strict=True)) < 1e-4

    max_diff = max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))
    same = sum(
        int((g.argmax(-1) == e.argmax(-1)).sum()) for g, e in zip(got, expected, strict=True)
    )
    agreement = same / sum(len(i) for i in ids)
    tokens = _engine_tokens(loaded)
    equal = [
        sum(a == b for a, b in zip(t, e, strict=True))
        for t, e in zip(tokens, expected_tokens, strict=True)
    ]
    greedy_agreement = sum(equal) / (len(PROMPTS) * NUM_NEW_TOKENS)
    print(
        f"{name}: max |logit diff| {max_diff:.3g}, argmax agreement {agreement:.3f}, "
        f"greedy tokens equal per prompt {equal}"
    )
    max_allowed, min_agreement, min_greedy = TOLERANCES[name]
    assert max_diff <= max_allowed
    assert agreement >= min_agreement
    assert greedy_agreement >= min_greedy
