"""Each weight format builds, generates and is reported as held; an explicit format the worker
cannot hold stops the build with its reason (no fallback); `auto` says what it chose."""

from dataclasses import replace

import pytest
import torch
from intentserve import LLM
from intentserve.policy import (
    IntentError,
    PagedAttentionRequiredError,
    ReasonCode,
    WeightFormat,
    WeightFormatStatus,
)
from intentserve.worker.engine.builder import EngineBuilder, _probe, build_engine
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.quant_linear import W8A8Linear
from intentserve.worker.model.registry import load_model
from intentserve.worker.model.weight_format import held_format, resident_weight_bytes

from tests.worker.model.tiny_checkpoints import random_hf_weights, tiny_config, write_hf_folder

FORMATS = [WeightFormat.DEQUANTIZED, WeightFormat.INT8, WeightFormat.INT4, WeightFormat.W8A8]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    config = tiny_config()
    return write_hf_folder(tmp_path_factory.mktemp("tiny"), config, random_hf_weights(config))


def builder(weights) -> EngineBuilder:
    return (
        EngineBuilder()
        .weights(weights)
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=64, max_num_seqs=4)
    )


def greedy(engine, prompts, max_tokens=8):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [out.new_token_ids for out in engine.generate(prompts, params)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_format_builds_generates_and_is_reported_as_held(tiny_folder, dtype):
    held, sizes, outputs = {}, {}, {}
    for fmt in FORMATS:
        loaded = load_model(str(tiny_folder), dtype=dtype)
        engine = builder(fmt.value).build(loaded=loaded)
        cache = engine.realized.cache
        held[fmt] = (cache.weight_format, held_format(loaded.model))
        sizes[fmt] = cache.weight_bytes
        outputs[fmt] = greedy(engine, ["def add(a, b):", "hello"])
        assert f"weights {fmt.value}" in engine.realized.describe()
    assert held == {fmt: (fmt, fmt) for fmt in FORMATS}
    assert sizes[WeightFormat.INT4] < sizes[WeightFormat.INT8] < sizes[WeightFormat.DEQUANTIZED]
    assert sizes[WeightFormat.W8A8] < sizes[WeightFormat.DEQUANTIZED]
    assert all(len(ids) == 8 for out in outputs.values() for ids in out)


def test_auto_keeps_the_weights_dequantized_and_says_why(tiny_folder):
    engine = builder("auto").build(loaded=load_model(str(tiny_folder), dtype="float32"))
    assert engine.realized.cache.weight_format is WeightFormat.DEQUANTIZED


def test_an_explicit_format_the_worker_cannot_hold_stops_the_build(tiny_folder):
    loaded = load_model(str(tiny_folder), dtype="float32")
    config = builder("int4").config
    probed = _probe(config, loaded, 64)
    no_int4 = replace(
        probed,
        weight_formats=(
            WeightFormatStatus(WeightFormat.INT8, True),
            WeightFormatStatus(WeightFormat.INT4, False, "torch 2.1 lacks the int4 kernel"),
        ),
    )
    with pytest.raises(PagedAttentionRequiredError) as error:
        build_engine(config, loaded, no_int4)
    assert error.value.reason.code is ReasonCode.WEIGHT_FORMAT_UNAVAILABLE
    assert "weights: int4" in str(error.value) and "lacks the int4 kernel" in str(error.value)
    assert str(error.value) == (
        "The weight format was explicitly requested (weights: int4), but this cpu worker cannot "
        "hold weights 'int4' (torch 2.1 lacks the int4 kernel)"
    )  # said once, not "...requested, but weights 'int4' was requested, but..."
    # Nothing was quantized behind the refusal.
    assert held_format(loaded.model) is WeightFormat.DEQUANTIZED


def test_a_model_whose_shapes_int4_cannot_hold_is_refused_with_the_projection(tmp_path):
    config = tiny_config(intermediate_size=80)  # gate_up has 160 outputs: not a multiple of 64
    folder = write_hf_folder(tmp_path, config, random_hf_weights(config))
    with pytest.raises(PagedAttentionRequiredError) as error:
        builder("int4").build(loaded=load_model(str(folder), dtype="float32"))
    assert error.value.reason.code is ReasonCode.WEIGHT_FORMAT_UNAVAILABLE
    assert "gate_up_proj" in str(error.value)


@pytest.mark.parametrize("word", ["q4_1", "fp8", ""])
def test_the_builder_names_the_field_and_the_allowed_values(word):
    with pytest.raises(
        IntentError, match="weights: invalid value .*auto, dequantized, int8, int4, w8a8"
    ):
        EngineBuilder().weights(word)


def test_w8a8_smooths_every_projection_from_the_calibration_text_and_says_what_multiplies(
    tiny_folder,
):
    loaded = load_model(str(tiny_folder), dtype="float32")
    engine = builder("w8a8").build(loaded=loaded)
    model = loaded.model
    projections = [module for module in model.modules() if isinstance(module, W8A8Linear)]
    assert len(projections) == 4 * len(model.layers) + 1  # and the head
    assert all(module.inv_smooth is not None for module in projections)
    assert "projections: int8 GEMM kernel" in engine.realized.describe() or (
        "projections: torch._int_mm (" in engine.realized.describe()
    )


def test_the_llm_front_door_takes_the_format(tiny_folder):
    llm = LLM(
        str(tiny_folder),
        weights="int8",
        dtype="float32",
        kv_cache_memory="1Mi",
        max_model_len=64,
        max_num_seqs=2,
    )
    assert llm.realized.cache.weight_format is WeightFormat.INT8
    assert torch.is_tensor(llm.engine.runner.model.lm_head.qweight)


@pytest.mark.parametrize("fmt", ["dequantized", "w8a8"])
def test_the_reported_weight_bytes_are_what_is_resident_once_the_weights_are_packed(
    tiny_folder, fmt
):
    # A tied head gets a packed copy of the embedding table; counted before packing, a fresh
    # worker under-reported its weights by that copy.
    config = tiny_config(tie_word_embeddings=True)
    loaded = load_model(
        str(write_hf_folder(tiny_folder.parent / f"tied-{fmt}", config, random_hf_weights(config))),
        dtype="bfloat16",
    )
    engine = builder(fmt).build(loaded=loaded)
    assert engine.realized.cache.weight_bytes == resident_weight_bytes(loaded.model)
    embedding = loaded.model.embed_tokens.weight
    assert engine.realized.cache.weight_bytes > embedding.numel() * embedding.element_size()


def test_native_on_a_model_that_is_not_a_gguf_file_is_refused_naming_it(tiny_folder):
    loaded = load_model(str(tiny_folder), dtype="float32")
    with pytest.raises(PagedAttentionRequiredError) as error:
        builder("native").build(loaded=loaded)
    assert error.value.reason.code is ReasonCode.WEIGHT_FORMAT_UNAVAILABLE
    assert "weights: native" in str(error.value) and "is not a .gguf file" in str(error.value)
    assert held_format(loaded.model) is WeightFormat.DEQUANTIZED
