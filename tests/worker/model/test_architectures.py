"""Mistral, Qwen3 and Phi-3 (and Llama as the baseline): a tiny random checkpoint written by
transformers' own `save_pretrained`, loaded through `load_model(folder)` and served by the engine,
against transformers on the same checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model import ModelLoadError, load_model
from intentserve.worker.model.hf_reference import hf_logits
from intentserve.worker.model.reference_attention import reference_logits
from tiny_checkpoints import write_gguf
from transformers_checkpoints import FAMILIES, save_checkpoint, tiny_transformers_model

# ~100 tokens: longer than the sliding windows (16) and enough positions for RoPE to matter.
TEXT = "The quick brown fox jumps over the lazy dog. " * 8
PROMPTS = ["The quick brown fox", "Hello world! Numbers 0123", "def add(a, b):\n    return"]
NUM_NEW_TOKENS = 24
# fp32 on both sides; what differs is summation order (fused projections, SDPA kernels).
LOGITS_MAX_ABS_DIFF = 1e-4


@pytest.fixture(scope="module", params=list(FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(transformers model, the folder it saved, our load of that folder)."""
    theirs = tiny_transformers_model(request.param)
    folder = save_checkpoint(theirs, tmp_path_factory.mktemp(request.param))
    return theirs, folder, load_model(str(folder), dtype="float32")


def test_config_read_from_the_folder(checkpoint):
    theirs, _, loaded = checkpoint
    hf = theirs.config
    config = loaded.config
    assert config.head_dim == (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    assert config.num_kv_heads == hf.num_key_value_heads
    assert config.sliding_window == getattr(hf, "sliding_window", None)
    assert config.qk_norm == (hf.model_type == "qwen3")
    assert not config.qkv_bias


def test_logits_match_transformers(checkpoint):
    theirs, _, loaded = checkpoint
    ids = loaded.tokenizer.encode(TEXT, add_bos=False)
    ours = reference_logits(loaded.model, ids)
    reference = hf_logits(theirs, ids)
    assert (ours - reference).abs().max().item() < LOGITS_MAX_ABS_DIFF
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("paged", ["on", "off"])
def test_engine_greedy_tokens_match_transformers_generate(checkpoint, paged):
    theirs, _, loaded = checkpoint
    engine = (
        EngineBuilder()
        .paged_attention(paged)
        .kv_cache_memory(bytes=8 << 20)
        .scheduler(max_model_len=128, max_num_seqs=4)
        .build(loaded=loaded)
    )
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True))
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ids = loaded.tokenizer.encode(prompt)
        expected = theirs.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=NUM_NEW_TOKENS,
            min_new_tokens=NUM_NEW_TOKENS,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )[0, len(ids) :].tolist()
        assert list(output.new_token_ids) == expected, prompt


def _edit_config(folder, **fields) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def test_phi3_longrope_is_refused_naming_it(tmp_path):
    # Phi-3 128k checkpoints: two factor sets switched by length; not implemented, so refused.
    folder = save_checkpoint(tiny_transformers_model("phi3"), tmp_path / "m")
    long_rope = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0}
    _edit_config(
        folder, rope_parameters=long_rope | {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    )
    with pytest.raises(ModelLoadError, match="rope_scaling type 'longrope' is not supported"):
        load_model(str(folder))


def test_partial_rotary_is_refused_naming_it(tmp_path):
    folder = save_checkpoint(tiny_transformers_model("phi3"), tmp_path / "m")
    _edit_config(
        folder,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 0.5 is not supported"):
        load_model(str(folder))


def test_qwen3_per_layer_sliding_window_is_refused(tmp_path):
    model = tiny_transformers_model("qwen3", use_sliding_window=True, sliding_window=16)
    folder = save_checkpoint(model, tmp_path / "m")
    with pytest.raises(ModelLoadError, match="use_sliding_window"):
        load_model(str(folder))


@pytest.mark.parametrize("family", ["qwen3", "phi3", "phi3-sliding-window"])
def test_gguf_of_the_same_weights_matches_transformers(tmp_path, family):
    # The GGUF is laid out as llama.cpp's converter writes these families: Qwen3's q/k norms as
    # attn_q_norm/attn_k_norm, Phi-3's fused attn_qkv and its gate|up as ffn_up, no Q/K permute.
    theirs = tiny_transformers_model(family)
    folder = save_checkpoint(theirs, tmp_path / "hf")
    config = load_model(str(folder), dtype="float32").config
    path = write_gguf(tmp_path / "m.gguf", config, theirs.state_dict())
    loaded = load_model(str(path), dtype="float32")

    assert loaded.config.architecture == config.architecture
    for field in ("head_dim", "qk_norm", "qkv_bias", "sliding_window", "intermediate_size"):
        assert getattr(loaded.config, field) == getattr(config, field), field
    ids = loaded.tokenizer.encode(TEXT, add_bos=False)
    ours = reference_logits(loaded.model, ids)
    assert (ours - hf_logits(theirs, ids)).abs().max().item() < LOGITS_MAX_ABS_DIFF
