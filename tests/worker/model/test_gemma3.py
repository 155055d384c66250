"""Gemma 3 270M (Q4_K_M GGUF: Q4_K, Q5_0, Q6_K, Q8_0 tensors) against transformers' own reading
of the same file: config, logits, greedy tokens through the paged engine, and a prompt longer
than the 512-token window, prefilled in chunks. Loaded once per module (float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.hf_reference import hf_model_from_gguf
from intentserve.worker.model.reference_attention import reference_logits
from intentserve.worker.model.registry import load_model

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
]
NUM_TOKENS = 12
# About 730 tokens: the band of the local layers (512) is crossed well before the end.
LONG_PROMPT = (
    " ".join(
        f"Item {i}: the {word} costs {i * 7 % 100} coins and weighs {i % 13} kilograms."
        for i, word in enumerate(["apple", "lamp", "chair", "book", "kettle"] * 8)
    )
    + " The item that costs the most is"
)


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m", dtype="float32")


@pytest.fixture(scope="module")
def gemma_hf(gemma3_path: Path) -> torch.nn.Module:
    return hf_model_from_gguf(gemma3_path)


def _engine(loaded, *, max_num_batched_tokens: int = 2048):
    return (
        EngineBuilder()
        .model("gemma3-270m")
        .paged_attention("on")
        .kv_cache_memory(bytes=128 << 20)
        .scheduler(
            max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=max_num_batched_tokens
        )
        .build(loaded=loaded)
    )


def _hf_generate(
    model: torch.nn.Module, ids: list[int], num_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens, and its logits after the prompt ([vocab] float32)."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(ids) :].tolist(), out.logits[0][0].float()


def test_config_is_what_transformers_reads(gemma, gemma_hf):
    config, hf = gemma.config, gemma_hf.config
    assert config.sliding_window == hf.sliding_window == 512
    assert [w is None for w in config.layer_windows] == [
        t == "full_attention" for t in hf.layer_types
    ]
    assert config.layer_windows.count(None) == 3  # layers 5, 11 and 17
    assert config.rope_local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
    assert config.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert config.query_pre_attn_scalar == hf.query_pre_attn_scalar
    assert hf.final_logit_softcapping is None and hf.attn_logit_softcapping is None
    # The file carries no chat template: prompts are plain text after BOS.
    assert gemma.chat_template is None


def test_logits_match_transformers(gemma, gemma_hf):
    ids = gemma.tokenizer.encode(PROMPTS[0])
    with torch.inference_mode():
        theirs = gemma_hf(torch.tensor([ids])).logits[0].float()
    ours = reference_logits(gemma.model, ids)
    assert (ours - theirs).abs().max() < 1e-3
    assert ours[-1].argmax() == theirs[-1].argmax()


def test_greedy_text_on_the_paged_engine_matches_transformers(gemma, gemma_hf):
    outputs = _engine(gemma).generate(
        PROMPTS, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
    )
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        expected, _ = _hf_generate(gemma_hf, gemma.tokenizer.encode(prompt), NUM_TOKENS)
        assert list(out.new_token_ids) == expected, prompt
        assert out.new_text == gemma.tokenizer.decode(expected), prompt


def test_a_prompt_longer_than_the_window_matches_transformers(gemma, gemma_hf):
    ids = gemma.tokenizer.encode(LONG_PROMPT)
    assert len(ids) > 512 + 128  # the last queries' band starts far past position 0
    expected, last_logits = _hf_generate(gemma_hf, ids, 8)
    assert (reference_logits(gemma.model, ids)[-1] - last_logits).abs().max() < 1e-3
    engine = _engine(gemma, max_num_batched_tokens=256)  # prefilled in three chunks
    out = engine.generate([LONG_PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert list(out.new_token_ids) == expected
    assert engine.realized.cache.sliding_window == 512
