import pytest
from intentserve.policy import (
    BackendIntent,
    IntentError,
    KvCacheDtype,
    Mode,
    PagedAttentionConfig,
    PagedAttentionMode,
    mode_of,
    paged_attention_config,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto", Mode.AUTO),
        ("on", Mode.ON),
        ("off", Mode.OFF),
        ("AUTO", Mode.AUTO),
        (" On ", Mode.ON),
        ("oFF", Mode.OFF),
        (True, Mode.ON),  # YAML 1.1 reads a bare `on` as true
        (False, Mode.OFF),
        (Mode.ON, Mode.ON),
    ],
)
def test_mode_parses_case_insensitively(text, expected):
    assert PagedAttentionMode.parse(text, "paged_attention") is expected


@pytest.mark.parametrize("text", ["maybe", "", "enabled", "1", 1, None, "on-ish"])
def test_invalid_mode_names_field_and_allowed_values(text):
    with pytest.raises(IntentError) as err:
        Mode.parse(text, "spec.pagedAttention.mode")
    message = str(err.value)
    assert message.startswith("spec.pagedAttention.mode: invalid value")
    assert "allowed values are auto, on, off" in message
    assert err.value.field == "spec.pagedAttention.mode"


def test_backend_intent_and_kv_dtype_parse_and_reject():
    assert BackendIntent.parse("FLASH", "attention_backend") is BackendIntent.FLASH
    assert KvCacheDtype.parse("bfloat16", "kv_cache_dtype") is KvCacheDtype.BFLOAT16
    with pytest.raises(IntentError, match="allowed values are auto, flash, torch"):
        BackendIntent.parse("triton", "attention_backend")
    with pytest.raises(IntentError, match="kv_cache_dtype: invalid value 'int3'"):
        KvCacheDtype.parse("int3", "kv_cache_dtype")
    # Booleans are only a spelling of on/off, never of other enums.
    with pytest.raises(IntentError):
        BackendIntent.parse(True, "attention_backend")


@pytest.mark.parametrize(
    ("mode", "required"),
    [("off", None), ("auto", False), ("on", True)],
)
def test_config_keeps_the_policy(mode, required):
    config = paged_attention_config(mode)
    if required is None:
        assert config is None
        assert mode_of(config) is Mode.OFF
    else:
        assert config == PagedAttentionConfig(required=required)
        assert config.block_size == 16
        assert mode_of(config) is Mode(mode)


def test_config_carries_every_option():
    config = paged_attention_config(
        "on",
        block_size=32,
        kv_cache_bytes=1 << 20,
        prefix_caching="off",
        backend="torch",
        kv_cache_dtype="bfloat16",
    )
    assert config == PagedAttentionConfig(
        required=True,
        block_size=32,
        kv_cache_bytes=1 << 20,
        prefix_caching=Mode.OFF,
        backend=BackendIntent.TORCH,
        kv_cache_dtype=KvCacheDtype.BFLOAT16,
    )
    assert config.describe() == "paged_attention: on"


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"block_size": 0}, "block_size", "between 1 and 1024"),
        ({"block_size": 4096}, "block_size", "between 1 and 1024"),
        ({"block_size": "16"}, "block_size", "must be an integer"),
        ({"kv_cache_bytes": 10, "kv_cache_fraction": 0.5}, "kv_cache_memory", "not both"),
        ({"kv_cache_bytes": -1}, "kv_cache_bytes", "positive integer"),
        ({"kv_cache_fraction": 0.0}, "kv_cache_fraction", "(0, 1]"),
        ({"kv_cache_fraction": 1.5}, "kv_cache_fraction", "(0, 1]"),
        ({"prefix_caching": "sometimes"}, "prefix_caching", "allowed values are auto, on, off"),
    ],
)
def test_bad_config_names_the_field(kwargs, field, fragment):
    with pytest.raises(IntentError) as err:
        paged_attention_config("auto", **kwargs)
    assert err.value.field == field
    assert fragment in str(err.value)


def test_prefix_caching_on_with_paging_off_is_a_contradiction():
    with pytest.raises(IntentError, match="prefix_caching: 'on' needs a paged KV cache"):
        paged_attention_config("off", prefix_caching="on")
    assert paged_attention_config("off", prefix_caching="auto") is None
