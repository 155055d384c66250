"""The model over a flattened varlen batch, with attention delegated to a backend."""

from __future__ import annotations

import pytest
import torch
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.reference_attention import CausalAttention
from one_sequence_cache import OneSequenceKVCache
from tiny_checkpoints import random_hf_weights, tiny_config


class PerSequenceCausal:
    """meta = the sequence lengths; each sequence attends only within itself."""

    def forward(self, layer_idx, q, k, v, meta):
        parts = zip(q.split(meta), k.split(meta), v.split(meta), strict=True)
        return torch.cat([CausalAttention().forward(layer_idx, *p) for p in parts])


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    config = tiny_config()
    return LlamaModel.from_hf_weights(config, random_hf_weights(config))


def test_sequences_in_one_batch_equal_separate_runs(model):
    lengths = [7, 3, 12]
    seqs = [torch.randint(0, model.config.vocab_size, (n,)) for n in lengths]
    separate = [model(ids, torch.arange(len(ids)), CausalAttention(), None) for ids in seqs]
    batched = model(
        torch.cat(seqs), torch.cat([torch.arange(n) for n in lengths]), PerSequenceCausal(), lengths
    )
    assert batched.shape == (sum(lengths), model.config.hidden_size)
    torch.testing.assert_close(batched, torch.cat(separate), rtol=1e-5, atol=1e-5)


def test_cached_decode_equals_full_recompute(model):
    ids = torch.randint(0, model.config.vocab_size, (20,))
    full = model.compute_logits(model(ids, torch.arange(20), CausalAttention(), None))
    cache = OneSequenceKVCache()
    steps = [model(ids[:15], torch.arange(15), cache, None)]
    steps += [model(ids[i : i + 1], torch.tensor([i]), cache, None) for i in range(15, 20)]
    incremental = model.compute_logits(torch.cat(steps))
    assert incremental.dtype == torch.float32 and incremental.shape == (20, model.config.vocab_size)
    torch.testing.assert_close(incremental, full, rtol=1e-4, atol=1e-4)


def test_encoder_config_builds_no_decoder():
    with pytest.raises(ValueError, match="not a decoder"):
        LlamaModel(tiny_config(architecture="BertModel", has_kv_cache=False))


def test_unexpected_and_missing_weights_are_named():
    config = tiny_config()
    weights = random_hf_weights(config)
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.9.extra'"):
        LlamaModel.from_hf_weights(config, weights | {"model.layers.9.extra": torch.zeros(1)})
    weights.pop("lm_head.weight")
    with pytest.raises(ValueError, match="no weight 'lm_head.weight'"):
        LlamaModel.from_hf_weights(config, weights)
