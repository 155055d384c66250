"""Gemma 3 270M (Q4_K_M GGUF: Q4_K, Q5_0, Q6_K, Q8_0 tensors) against transformers' own reading
of the same file: logits, greedy tokens, and a prompt longer than the 512-token window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from intentserve.worker.model.gguf_loader import (
    build_gguf_decoder,
    gguf_model_config,
    open_gguf,
)
from intentserve.worker.model.hf_reference import hf_model_from_gguf
from intentserve.worker.model.reference_attention import reference_logits

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma(gemma3_path: Path):
    f = open_gguf(gemma3_path)
    config = gguf_model_config(f)
    return f, config, build_gguf_decoder(f, config, torch.float32, "cpu")


@pytest.fixture(scope="module")
def gemma_hf(gemma3_path: Path) -> torch.nn.Module:
    return hf_model_from_gguf(gemma3_path)


def _ids(f, pieces: list[str]) -> list[int]:
    """BOS and the ids of these vocabulary pieces ('▁' marks a leading space)."""
    tokens = f.metadata["tokenizer.ggml.tokens"]
    index = {piece: i for i, piece in enumerate(tokens) if piece in set(pieces)}
    return [f.metadata["tokenizer.ggml.bos_token_id"]] + [index[p] for p in pieces]


PROMPTS = [
    ["The", "▁capital", "▁of", "▁France", "▁is"],
    ["The", "▁quick", "▁brown", "▁fox"],
    ["Once", "▁upon", "▁a", "▁time", ","],
]


def test_config_is_what_transformers_reads(gemma, gemma_hf):
    _, config, _ = gemma
    hf = gemma_hf.config
    assert config.sliding_window == hf.sliding_window == 512
    assert [w is None for w in config.layer_windows] == [
        t == "full_attention" for t in hf.layer_types
    ]
    assert config.layer_windows.count(None) == 3  # layers 5, 11 and 17
    assert config.rope_local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
    assert config.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert config.query_pre_attn_scalar == hf.query_pre_attn_scalar
    assert hf.final_logit_softcapping is None and hf.attn_logit_softcapping is None


def test_logits_match_transformers(gemma, gemma_hf):
    f, _, model = gemma
    ids = _ids(f, PROMPTS[0])
    with torch.inference_mode():
        theirs = gemma_hf(torch.tensor([ids])).logits[0].float()
    ours = reference_logits(model, ids)
    assert (ours - theirs).abs().max() < 1e-3
    assert ours[-1].argmax() == theirs[-1].argmax()


def _greedy(model, ids: list[int], num_tokens: int) -> list[int]:
    out = []
    for _ in range(num_tokens):
        out.append(int(reference_logits(model, ids + out)[-1].argmax()))
    return out


def test_greedy_tokens_match_transformers(gemma, gemma_hf):
    f, _, model = gemma
    for pieces in PROMPTS:
        ids = _ids(f, pieces)
        with torch.inference_mode():
            theirs = gemma_hf.generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, min_new_tokens=12
            )[0, len(ids) :].tolist()
        assert _greedy(model, ids, 12) == theirs, pieces
