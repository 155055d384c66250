"""bench/workloads.py's byte counts, from which the engine bench's limits are computed."""

import torch
from intentserve.worker.model.registry import load_model

from bench.workloads import PROMPTS, Models, decode_read_bytes, weight_bytes_per_step
from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder


def test_a_decode_step_reads_the_weights_and_every_sequences_kv_at_its_mean_context(tmp_path):
    config = tiny_config()
    loaded = load_model(str(write_hf_folder(tmp_path, config, random_hf_weights(config))))
    models = Models(ours=loaded, hf=None)
    model = loaded.model
    per_layer = [model.layers[0].self_attn.qkv_proj, model.layers[0].self_attn.o_proj]
    per_layer += [model.layers[0].mlp.gate_up_proj, model.layers[0].mlp.down_proj]
    weights = sum(p.numel() for m in per_layer for p in m.parameters()) * config.num_layers
    head = model.lm_head.weight if model.lm_head is not None else model.embed_tokens.weight
    weights = (weights + head.numel()) * loaded.dtype.itemsize
    assert weight_bytes_per_step(models) == weights

    # 3 sequences of PROMPTS[0..2], 16 new tokens: each at its prompt + 8 tokens on average;
    # K and V, every layer, every KV head
    prompt_tokens = sum(len(loaded.tokenizer.encode(p)) for p in PROMPTS[:3])
    kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim
    kv_per_token *= loaded.dtype.itemsize
    expected = weights + int((prompt_tokens + 3 * 8) * kv_per_token)
    assert decode_read_bytes(models, 3, 16) == expected
    assert loaded.dtype in (torch.float32, torch.bfloat16)


def test_the_side_load_wakes_as_often_as_the_served_runs_client_and_controller():
    from bench.served_path import wakeups_per_token

    # 64 streams on one call: one message a step each way through the controller; the
    # thread-per-stream client wakes each stream's thread per token, its reader per step
    assert wakeups_per_token("threads", 1, 64) == (1 + 1 / 64, 2 / 64)
    assert wakeups_per_token("threads", 4, 32) == (1 / 4 + 1 / 32, 2 / 32)
    assert wakeups_per_token("asyncio", 1, 64) == (1 / 64, 2 / 64)
