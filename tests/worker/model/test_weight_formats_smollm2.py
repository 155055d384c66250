"""SmolLM2 held as int8, int4 and w8a8 against its dequantized floats: the Q4_1 projections are held
exactly by int4, and the logits stay within the tolerances measured here (prefill through the
dequantize path, decode steps through the int kernels)."""

import pytest
import torch
from intentserve.policy import WeightFormat
from intentserve.worker.model.calibration import CALIBRATION_TEXT
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.weight_format import quantize_linears

from tests.worker.model.one_sequence_cache import OneSequenceKVCache

pytestmark = pytest.mark.model

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
NUM_PREFILL = 18  # more rows than KERNEL_MAX_ROWS: the dequantize path; then one row per step

# (max, mean) absolute logit difference allowed, measured on this prompt (logits' std ~5.9):
# float32 int8 1.37 / 0.21, int4 0.59 / 0.05 (its Q4_1 projections exact, its int8 head not);
# bfloat16 int8 2.15 / 0.30, int4 1.25 / 0.18 (scales, and Q4_1's d and m, rounded to bfloat16).
TOLERANCE = {
    ("float32", WeightFormat.INT8): (2.0, 0.3),
    ("float32", WeightFormat.INT4): (1.0, 0.1),
    ("bfloat16", WeightFormat.INT8): (3.0, 0.4),
    ("bfloat16", WeightFormat.INT4): (2.0, 0.3),
    # w8a8 (activations int8 too, smoothed with the calibration text's ranges), measured:
    # float32 3.58 / 0.55, bfloat16 3.56 / 0.50
    ("float32", WeightFormat.W8A8): (5.0, 0.75),
    ("bfloat16", WeightFormat.W8A8): (5.0, 0.75),
}


def held(smollm2, fmt: WeightFormat, dtype: torch.dtype) -> LlamaModel:
    model = LlamaModel.from_hf_weights(smollm2.config, smollm2.weights, dtype)
    if fmt is not WeightFormat.DEQUANTIZED:
        quantize_linears(model, fmt, smollm2.tokenizer.encode(CALIBRATION_TEXT))
    return model


@torch.inference_mode()
def logits(model: LlamaModel, ids: torch.Tensor) -> torch.Tensor:
    cache = OneSequenceKVCache()
    out = [model.compute_logits(model(ids[:NUM_PREFILL], torch.arange(NUM_PREFILL), cache, None))]
    for i in range(NUM_PREFILL, len(ids)):
        out.append(model.compute_logits(model(ids[i : i + 1], torch.tensor([i]), cache, None)))
    return torch.cat(out)  # [num_tokens, vocab]


def test_int4_holds_the_q4_1_projections_exactly(smollm2):
    model = held(smollm2, WeightFormat.INT4, torch.float32)
    for ours, reference in zip(model.layers, smollm2.model.layers, strict=True):
        for name in ("qkv_proj", "o_proj"):
            got = getattr(ours.self_attn, name).dequantize()
            assert torch.allclose(got, getattr(reference.self_attn, name).weight, atol=1e-6)
        for name in ("gate_up_proj", "down_proj"):
            got = getattr(ours.mlp, name).dequantize()
            assert torch.allclose(got, getattr(reference.mlp, name).weight, atol=1e-6)


@pytest.mark.parametrize(("dtype_name", "fmt"), list(TOLERANCE))
def test_logits_stay_within_the_measured_tolerance(smollm2, dtype_name, fmt):
    dtype = getattr(torch, dtype_name)
    ids = torch.tensor(smollm2.tokenizer.encode(PROMPT))
    assert len(ids) > NUM_PREFILL
    reference = logits(held(smollm2, WeightFormat.DEQUANTIZED, dtype), ids)
    got = logits(held(smollm2, fmt, dtype), ids)
    difference = (got - reference).abs()
    max_allowed, mean_allowed = TOLERANCE[(dtype_name, fmt)]
    assert difference.max().item() <= max_allowed
    assert difference.mean().item() <= mean_allowed
    # The next token after the prompt is the same.
    assert got[-1].argmax() == reference[-1].argmax()
