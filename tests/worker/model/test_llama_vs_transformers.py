"""Our decoder on the real SmolLM2 GGUF weights against transformers on the same weights."""

from __future__ import annotations

import pytest
import torch
from intentserve.worker.model.hf_reference import hf_logits
from intentserve.worker.model.reference_attention import reference_logits
from one_sequence_cache import OneSequenceKVCache

pytestmark = pytest.mark.model

# fp32 on both sides; the only differences are summation order (fused q|k|v and gate|up
# matmuls, SDPA kernel choice), so the logits agree far below any decision-relevant scale.
LOGITS_MAX_ABS_DIFF = 1e-3

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a land far away, there lived a dragon who loved 42 kinds of cheese.",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_match_transformers(smollm2, smollm2_hf, prompt):
    ids = smollm2.tokenizer.encode(prompt)
    ours = reference_logits(smollm2.model, ids)
    theirs = hf_logits(smollm2_hf, ids)
    max_abs_diff = (ours - theirs).abs().max().item()
    print(f"max |logit diff| = {max_abs_diff:.2e} over {len(ids)} tokens")
    assert max_abs_diff < LOGITS_MAX_ABS_DIFF
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_rope_permutation_is_undone(smollm2):
    # The weights share nothing with transformers here, so this checks the GGUF Q/K un-permute:
    # with llama.cpp's interleaved layout left in place the model cannot answer this.
    ids = smollm2.tokenizer.encode("The capital of France is")
    next_id = int(reference_logits(smollm2.model, ids)[-1].argmax())
    assert smollm2.tokenizer.decode([next_id]) == " Paris"


@torch.inference_mode()
def _greedy_ours(model, ids: list[int], num_new_tokens: int) -> list[int]:
    # Prefill the prompt, then one token per step through a cache (recomputing the whole
    # sequence with CausalAttention gives the same tokens but takes minutes on 2 cores).
    cache = OneSequenceKVCache()
    ids = list(ids)
    step_ids, step_positions = torch.tensor(ids), torch.arange(len(ids))
    for _ in range(num_new_tokens):
        hidden = model(step_ids, step_positions, cache, None)
        ids.append(int(model.compute_logits(hidden[-1:]).argmax()))
        step_ids, step_positions = torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1])
    return ids


# NOTE: the slowest model test: ~25 s on 2 idle cores (minutes when they are shared).
@torch.inference_mode()
def test_greedy_decoding_matches_transformers_generate(smollm2, smollm2_hf):
    num_new_tokens = 64
    for prompt in PROMPTS[:3]:
        ids = smollm2.tokenizer.encode(prompt)
        theirs = smollm2_hf.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=num_new_tokens,
            min_new_tokens=num_new_tokens,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )[0].tolist()
        ours = _greedy_ours(smollm2.model, ids, num_new_tokens)
        assert ours == theirs, smollm2.tokenizer.decode(ours)


@pytest.fixture
def fused(smollm2):
    """The session's float32 model with the fused CPU norms and activations switched on."""
    from intentserve.worker.model.cpu_ops import disable_fused_ops, enable_fused_ops

    assert enable_fused_ops(smollm2.model) == "fused CPU kernels"
    yield smollm2
    disable_fused_ops(smollm2.model)


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_logits_match_transformers_with_fused_cpu_ops(fused, smollm2_hf, prompt):
    ids = fused.tokenizer.encode(prompt)
    ours = reference_logits(fused.model, ids)
    theirs = hf_logits(smollm2_hf, ids)
    assert (ours - theirs).abs().max().item() < LOGITS_MAX_ABS_DIFF
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_fused_cpu_ops_keep_the_greedy_tokens_in_float32(smollm2):
    """The compiled norms, SiLU and in-place rotary change speed, not tokens: one-token decode
    steps (the path they speed up) pick the same tokens as the torch ops."""
    from intentserve.worker.model.cpu_ops import disable_fused_ops, enable_fused_ops

    ids = smollm2.tokenizer.encode(PROMPTS[1])
    plain = _greedy_ours(smollm2.model, ids, 24)
    enable_fused_ops(smollm2.model)
    try:
        fast = _greedy_ours(smollm2.model, ids, 24)
    finally:
        disable_fused_ops(smollm2.model)
    assert fast == plain


def test_fused_cpu_ops_agree_with_torch_ops_in_bfloat16(smollm2_path):
    """bf16: the fused ops round where the torch ops round, so the logits match; what could
    differ is float32 summation order and the exp inside SiLU crossing a rounding boundary."""
    from intentserve.worker.model.cpu_ops import disable_fused_ops, enable_fused_ops
    from intentserve.worker.model.registry import load_model

    model = load_model(str(smollm2_path), dtype="bfloat16").model
    ids = [1, 504, 3458, 282, 4649, 314, 17, 1115, 4417, 11, 30, 3]
    plain = reference_logits(model, ids)
    enable_fused_ops(model)
    try:
        fast = reference_logits(model, ids)
    finally:
        disable_fused_ops(model)
    assert torch.equal(plain.argmax(-1), fast.argmax(-1))
    # Measured here: identical. Allowed: two bf16 ulps at the largest logits (~35), for a CPU
    # whose compiler contracts multiply-adds differently.
    assert (plain - fast).abs().max().item() <= 0.25
