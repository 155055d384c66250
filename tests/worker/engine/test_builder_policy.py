"""Policy at the loaders: every incompatibility goes through the fallback helper, so `auto` falls
back with the reason recorded and `on` fails at start-up naming the setting and the reason."""

import pytest
from intentserve.policy import (
    CacheKind,
    IntentError,
    PagedAttentionRequiredError,
    ReasonCode,
    SchedulerKind,
)
from intentserve.worker.cache.kv_pool import KvBudgetError
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.loaded import ModelLoadError
from intentserve.worker.model.registry import load_model

MIB = 1 << 20


def builder(mode: str, **options) -> EngineBuilder:
    return (
        EngineBuilder()
        .paged_attention(mode, **options)
        .kv_cache_memory(bytes=16 * MIB)
        .scheduler(max_model_len=128, max_num_seqs=4)
    )


def codes(engine) -> list[ReasonCode]:
    return [r.code for r in engine.realized.cache.fallback_reasons]


@pytest.mark.model
def test_on_realizes_the_torch_paged_backend_on_cpu(smollm2_fp32):
    cache = builder("on").build(loaded=smollm2_fp32).realized.cache
    assert (cache.kind, cache.backend.value, cache.scheduler) == (
        CacheKind.PAGED,
        "torch_paged",
        SchedulerKind.PAGED,
    )
    assert cache.block_size == 16 and cache.num_blocks > 0 and cache.kv_cache_bytes <= 16 * MIB


@pytest.mark.model
def test_auto_on_cpu_falls_back_to_the_default_scheduler_and_says_why(smollm2_fp32):
    engine = builder("auto").build(loaded=smollm2_fp32)
    assert engine.realized.cache.kind is CacheKind.CONTIGUOUS
    assert engine.realized.cache.scheduler is SchedulerKind.DEFAULT
    assert ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE in codes(engine)
    enabled = builder("auto").auto_enabled_devices("cpu", "cuda").build(loaded=smollm2_fp32)
    assert enabled.realized.cache.kind is CacheKind.PAGED


@pytest.mark.model
def test_off_never_builds_a_paged_cache(smollm2_fp32):
    engine = builder("off").build(loaded=smollm2_fp32)
    assert engine.realized.cache.kind is CacheKind.CONTIGUOUS and codes(engine) == []


@pytest.mark.model
def test_no_kv_cache_mode(smollm2_fp32):
    with pytest.raises(
        PagedAttentionRequiredError,
        match=r"\(paged_attention: on\), but the "
        "worker runs in no_kv_cache debug mode",
    ):
        builder("on").no_kv_cache().build(loaded=smollm2_fp32)
    debug = builder("auto").no_kv_cache().build(loaded=smollm2_fp32)
    assert debug.realized.cache.kind is CacheKind.NONE
    assert debug.realized.cache.scheduler is SchedulerKind.DEFAULT
    assert ReasonCode.KV_CACHE_DISABLED in codes(debug)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    paged = builder("on").build(loaded=smollm2_fp32)
    prompt = "The capital of France is"
    assert debug.generate([prompt], params)[0].new_token_ids == (
        paged.generate([prompt], params)[0].new_token_ids
    )


@pytest.mark.model
def test_a_model_without_kv_cache():
    minilm = load_model("minilm-l6")
    with pytest.raises(
        PagedAttentionRequiredError, match=r"the model \(BertModel\) has no KV cache"
    ):
        builder("on").build(loaded=minilm)
    # auto: the policy lets it fall back, but an encoder cannot generate at all.
    with pytest.raises(ModelLoadError, match="BertModel is not a decoder language model"):
        builder("auto").build(loaded=minilm)


@pytest.mark.model
def test_a_device_map_mixing_cpu_and_cuda(smollm2_fp32):
    layers = ("cpu",) * 15 + ("cuda",) * 15
    with pytest.raises(PagedAttentionRequiredError) as err:
        builder("on").device("cpu", layers).build(loaded=smollm2_fp32)
    assert str(err.value) == (
        "PagedAttention was explicitly requested (paged_attention: on), but the device map places "
        "layers on cpu and cuda; the paged KV cache must live on one device"
    )
    with pytest.raises(ValueError, match="device_map: layers on several devices"):
        builder("auto").device("cpu", layers).build(loaded=smollm2_fp32)


@pytest.mark.model
def test_a_kv_cache_dtype_the_backend_cannot_store(smollm2_fp32):
    with pytest.raises(
        PagedAttentionRequiredError, match="kv_cache_dtype 'fp8_e4m3' cannot be stored"
    ):
        builder("on", kv_cache_dtype="fp8_e4m3").build(loaded=smollm2_fp32)
    engine = (
        builder("auto", kv_cache_dtype="fp8_e4m3")
        .auto_enabled_devices("cpu")
        .build(loaded=smollm2_fp32)
    )
    assert engine.realized.cache.kind is CacheKind.CONTIGUOUS
    assert ReasonCode.KV_CACHE_DTYPE_UNSUPPORTED in codes(engine)
    bf16 = builder("on", kv_cache_dtype="bfloat16").build(loaded=smollm2_fp32)
    assert bf16.realized.cache.kv_cache_dtype == "bfloat16"


@pytest.mark.model
def test_the_flash_backend_asked_for_but_not_importable(smollm2_fp32):
    for mode in ("on", "auto"):
        with pytest.raises(PagedAttentionRequiredError) as err:
            builder(mode, backend="flash").build(loaded=smollm2_fp32)
        message = str(err.value)
        assert message.startswith(
            "The attention backend was explicitly requested (attention_backend: flash)"
        )
        assert "vllm-flash-attn needs a CUDA device; this worker is cpu" in message


@pytest.mark.model
@pytest.mark.parametrize("mode", ["on", "auto", "off"])
def test_a_kv_budget_too_small_for_one_sequence_is_an_error_in_every_mode(smollm2_fp32, mode):
    per_token = 2 * 30 * 3 * 64 * 4  # float32 K and V over 30 layers, 3 kv heads of 64
    tight = builder(mode).kv_cache_memory(bytes=100 * per_token).scheduler(max_model_len=128)
    with pytest.raises(KvBudgetError) as err:
        tight.build(loaded=smollm2_fp32)
    message = str(err.value)
    assert f"{per_token} bytes/token" in message
    assert f"gives {100 * per_token} bytes" in message
    largest = 96 if mode == "on" else 100  # paged: 6 whole blocks of 16; contiguous: 100 tokens
    assert f"the largest max_model_len that fits is {largest}" in message


def test_bad_intents_are_refused_at_the_builder():
    with pytest.raises(IntentError, match="paged_attention: invalid value 'sometimes'"):
        EngineBuilder().paged_attention("sometimes")
    with pytest.raises(IntentError, match="block_size: must be between 1 and 1024"):
        EngineBuilder().paged_attention("on", block_size=0)


@pytest.mark.parametrize("option", ["kv_cache_bytes", "kv_cache_fraction", "kv_cache_memory"])
def test_a_budget_among_the_paged_options_is_refused_naming_it(option):
    # One route for the KV budget: `kv_cache_memory()`, in every mode. A second one in the paged
    # options would be silently preferred or dropped, so it is an error naming the option.
    with pytest.raises(IntentError, match=f"^{option}: the KV budget is set with kv_cache_memory"):
        EngineBuilder().paged_attention("on", **{option: 1 << 20})


def test_an_option_with_off_and_an_unknown_option_are_refused_naming_them():
    with pytest.raises(IntentError, match="^backend: 'torch' has no effect"):
        EngineBuilder().paged_attention("off", backend="torch")
    with pytest.raises(IntentError, match="^blocksize: unknown option; allowed: block_size"):
        EngineBuilder().paged_attention("on", blocksize=8)


def test_the_builder_budget_reaches_the_config_once():
    config = EngineBuilder().paged_attention("on").kv_cache_memory(bytes=8 * MIB).config
    assert config.kv_budget.num_bytes == 8 * MIB
    assert config.paged.block_size == 16
