import pytest
from intentserve.policy import (
    BackendIntent,
    IntentError,
    KvBudget,
    KvCacheDtype,
    Mode,
    PagedAttentionConfig,
    PagedAttentionMode,
    mode_of,
    paged_attention_config,
    paged_attention_intent,
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
    assert BackendIntent.parse("Triton", "attention_backend") is BackendIntent.TRITON
    with pytest.raises(IntentError, match="allowed values are auto, flash, torch, triton"):
        BackendIntent.parse("flashinfer", "attention_backend")
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
        prefix_caching="off",
        backend="torch",
        kv_cache_dtype="bfloat16",
    )
    assert config == PagedAttentionConfig(
        required=True,
        block_size=32,
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
        ({"prefix_caching": "sometimes"}, "prefix_caching", "allowed values are auto, on, off"),
    ],
)
def test_bad_config_names_the_field(kwargs, field, fragment):
    with pytest.raises(IntentError) as err:
        paged_attention_config("auto", **kwargs)
    assert err.value.field == field
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("block_size", 32),
        ("block_size", 16),  # even the default, when written, says something that cannot happen
        ("prefix_caching", Mode.ON),
        ("prefix_caching", Mode.AUTO),
        ("backend", BackendIntent.TORCH),
        ("backend", BackendIntent.AUTO),
        ("kv_cache_dtype", KvCacheDtype.BFLOAT16),
    ],
)
def test_an_option_given_with_off_is_refused_naming_it(option, value):
    # No paged cache is built with `off`, so an explicit option of it can never take effect:
    # it is refused instead of silently dropped.
    with pytest.raises(IntentError) as err:
        paged_attention_intent(Mode.OFF, **{option: value})
    assert err.value.field == option
    assert "has no effect while paged_attention is 'off'" in str(err.value)


def test_off_with_no_option_or_prefix_caching_off_is_none():
    assert paged_attention_intent(Mode.OFF) is None
    assert paged_attention_intent(Mode.OFF, prefix_caching=Mode.OFF) is None
    assert paged_attention_config("off", prefix_caching="off") is None


def test_options_not_given_take_their_defaults():
    assert paged_attention_intent(Mode.ON) == PagedAttentionConfig(required=True)
    assert paged_attention_intent(Mode.AUTO, block_size=8) == PagedAttentionConfig(
        required=False, block_size=8
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_bytes": 10, "fraction": 0.5}, "not both"),
        ({"num_bytes": -1}, "positive integer"),
        ({"num_bytes": True}, "positive integer"),
        ({"fraction": 0.0}, "(0, 1]"),
        ({"fraction": 1.5}, "(0, 1]"),
    ],
)
def test_a_bad_kv_budget_names_kv_cache_memory(kwargs, fragment):
    with pytest.raises(IntentError) as err:
        KvBudget(**kwargs)
    assert err.value.field == "kv_cache_memory"
    assert fragment in str(err.value)


def test_kv_budget_describes_itself():
    assert KvBudget(num_bytes=1 << 20).describe() == "1048576 bytes"
    assert KvBudget(fraction=0.25).describe() == "25% of free memory"
    assert KvBudget().describe() == "the device's default share of free memory"
