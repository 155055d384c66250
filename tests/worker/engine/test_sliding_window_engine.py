"""Interleaved banded and global layers (a tiny random Gemma 3: a 5-token band on 5 of 6 layers)
through every cache the engine builds, prompts far longer than the band, prefilled in chunks:
the greedy tokens are those of cache-free attention over the whole sequence. The realized report
says how the band is realized."""

from __future__ import annotations

import pytest
import torch
from intentserve.controller.control.explain import describe_realized
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.reference_attention import reference_logits
from intentserve.worker.model.registry import load_model

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_gguf

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = [
    [int(i) for i in torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(n))]
    for n in (37, 12, 3)
]


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    config = tiny_config("gemma3")
    path = write_gguf(
        tmp_path_factory.mktemp("gemma") / "tiny.gguf", config, random_hf_weights(config)
    )
    return load_model(str(path), dtype="float32")


def _reference_greedy(loaded, ids: list[int]) -> list[int]:
    out: list[int] = []
    for _ in range(GREEDY.max_tokens):
        out.append(int(reference_logits(loaded.model, ids + out)[-1].argmax()))
    return out


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("on", {"block_size": 4}),  # blocks smaller than the band: it starts mid-block
        ("on", {"block_size": 16}),
        ("off", {}),  # contiguous cache
    ],
    ids=["paged-4", "paged-16", "contiguous"],
)
def test_banded_layers_match_cache_free_attention(tiny_gemma, mode, options):
    engine = (
        EngineBuilder()
        .paged_attention(mode, **options)
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8)  # chunked
        .build(loaded=tiny_gemma)
    )
    outputs = engine.generate(PROMPTS, GREEDY)
    assert [list(o.new_token_ids) for o in outputs] == [
        _reference_greedy(tiny_gemma, p) for p in PROMPTS
    ]


def test_the_no_kv_cache_mode_bands_the_same_layers(tiny_gemma):
    engine = (
        EngineBuilder()
        .paged_attention("off")
        .no_kv_cache()
        .scheduler(max_model_len=64, max_num_seqs=4)
        .build(loaded=tiny_gemma)
    )
    outputs = engine.generate(PROMPTS[:1], GREEDY)
    assert list(outputs[0].new_token_ids) == _reference_greedy(tiny_gemma, PROMPTS[0])


def test_the_realized_report_says_how_the_band_is_realized(tiny_gemma):
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=4)
        .build(loaded=tiny_gemma)
    )
    cache = engine.realized.cache
    assert (cache.sliding_window, cache.num_windowed_layers) == (5, 5)
    said = "sliding window 5 tokens on 5 layers, masked in attention (every layer keeps its blocks"
    assert said in engine.realized.describe()
    assert said in describe_realized(cache)  # the controller's `explain`
    # Gemma's (1 + w) float32-scaled norms, q/k norms and GELU run on gemma_ops.c where it builds.
    said = engine.realized.norms_and_activations
    on = [m.gemma_ops is not None for m in engine.runner.model.modules() if hasattr(m, "gemma_ops")]
    assert (said == "fused CPU kernels" and all(on)) or (
        said.startswith("torch ops") and not any(on)
    )
