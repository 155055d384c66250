"""The KV-cache memory budget as written: bytes, binary and decimal units, a share of free memory;
anything else is refused naming `kv_cache_memory` and the allowed forms."""

import pytest
from intentserve.policy import IntentError, KvBudget, parse_kv_memory


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, KvBudget()),
        (1024, KvBudget(num_bytes=1024)),
        ("1024", KvBudget(num_bytes=1024)),
        (" 2048 ", KvBudget(num_bytes=2048)),
        ("4Ki", KvBudget(num_bytes=4 << 10)),
        ("256Mi", KvBudget(num_bytes=256 << 20)),
        ("256 Mi", KvBudget(num_bytes=256 << 20)),
        ("1Gi", KvBudget(num_bytes=1 << 30)),
        ("1Ti", KvBudget(num_bytes=1 << 40)),
        ("3K", KvBudget(num_bytes=3000)),
        ("2M", KvBudget(num_bytes=2 * 10**6)),
        ("2G", KvBudget(num_bytes=2 * 10**9)),
        ("1T", KvBudget(num_bytes=10**12)),
        ("10%", KvBudget(fraction=0.1)),
        ("0.5%", KvBudget(fraction=0.005)),
        ("100%", KvBudget(fraction=1.0)),
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
