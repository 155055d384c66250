"""The KV-cache memory budget as written: bytes, binary and decimal units, a share of free memory;
anything else is refused naming `kv_cache_memory` and the allowed forms."""

import pytest
from intentserve.policy import IntentError, parse_kv_memory


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, None)),
        (1024, (1024, None)),
        ("1024", (1024, None)),
        (" 2048 ", (2048, None)),
        ("4Ki", (4 << 10, None)),
        ("256Mi", (256 << 20, None)),
        ("256 Mi", (256 << 20, None)),
        ("1Gi", (1 << 30, None)),
        ("1Ti", (1 << 40, None)),
        ("3K", (3000, None)),
        ("2M", (2 * 10**6, None)),
        ("2G", (2 * 10**9, None)),
        ("1T", (10**12, None)),
        ("10%", (None, 0.1)),
        ("0.5%", (None, 0.005)),
        ("100%", (None, 1.0)),
    ],
)
def test_kv_cache_memory_forms(value, expected):
    assert parse_kv_memory(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        "0",
        "0Mi",
        "-1",
        "101%",
        "0%",
        "-5%",
        "x%",
        "1.5Gi",
        "12XB",
        "1mi",
        "lots",
        "",
        0.5,
        True,
    ],
)
def test_kv_cache_memory_refuses_naming_the_field_and_the_forms(value):
    with pytest.raises(IntentError) as err:
        parse_kv_memory(value)
    assert err.value.field == "kv_cache_memory"
    assert str(err.value) == (
        f"kv_cache_memory: invalid value {value!r}; allowed: bytes (268435456, 256Mi, 1Gi) "
        "or a share of free device memory (10%)"
    )
