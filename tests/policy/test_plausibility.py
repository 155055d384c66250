"""A realized report that cannot be true (against the worker's own capability and the budget) is
refused with its own reason code, whatever the policy says."""

from dataclasses import replace

import pytest
from intentserve.policy import (
    BackendKind,
    CacheKind,
    KvBudget,
    RealizedCache,
    ReasonCode,
    SchedulerKind,
    check_plausible,
    examples,
)
from intentserve.policy.examples import GIB, LLAMA, kv_bytes_per_token

PER_TOKEN = kv_bytes_per_token(LLAMA)  # float32
HONEST = RealizedCache(
    kind=CacheKind.PAGED,
    backend=BackendKind.TORCH_PAGED,
    block_size=16,
    num_blocks=728,
    kv_cache_bytes=728 * 16 * PER_TOKEN,
    kv_cache_dtype="float32",
    max_num_seqs=16,
    scheduler=SchedulerKind.PAGED,
)
CPU = examples.cpu()  # 12 GiB free


def test_an_honest_report_is_plausible():
    assert check_plausible(HONEST, CPU, KvBudget()) is None
    assert check_plausible(HONEST, CPU, KvBudget(num_bytes=HONEST.kv_cache_bytes)) is None
    assert check_plausible(HONEST, CPU, KvBudget(fraction=0.5)) is None
    bf16 = replace(HONEST, kv_cache_dtype="bfloat16", kv_cache_bytes=728 * 16 * PER_TOKEN // 2)
    assert check_plausible(bf16, CPU, KvBudget()) is None
    none = RealizedCache(kind=CacheKind.NONE, max_num_seqs=4, scheduler=SchedulerKind.DEFAULT)
    assert check_plausible(none, CPU, KvBudget()) is None


@pytest.mark.parametrize(
    ("realized", "budget", "fragment"),
    [
        pytest.param(
            replace(HONEST, num_blocks=100_000_000, kv_cache_bytes=1 << 40),
            KvBudget(),
            "1099511627776 KV bytes reported, but only 12884901888 bytes of memory are free",
            id="one-tebibyte",
        ),
        pytest.param(
            HONEST, KvBudget(num_bytes=1 << 20), "over the budget of 1048576", id="over-bytes"
        ),
        pytest.param(
            HONEST, KvBudget(fraction=0.001), "over the budget of 0% of", id="over-fraction"
        ),
        pytest.param(
            replace(HONEST, num_blocks=10),
            KvBudget(),
            "for 10 blocks x 16 tokens x 46080 bytes per token",
            id="geometry",
        ),
        pytest.param(
            replace(HONEST, backend=BackendKind.FLASH_PAGED),
            KvBudget(),
            "flash_paged backend, which its capability lists as unavailable",
            id="backend-not-available",
        ),
        pytest.param(
            replace(HONEST, kv_cache_dtype="float8_e4m3fn"),
            KvBudget(),
            "cannot store kv dtype 'float8_e4m3fn'",
            id="dtype-not-storable",
        ),
        pytest.param(
            replace(HONEST, kv_cache_dtype="int3"),
            KvBudget(),
            "cannot store kv dtype 'int3'",
            id="dtype-unknown",
        ),
        pytest.param(
            replace(HONEST, max_num_seqs=0),
            KvBudget(),
            "no sequence slots (max_num_seqs 0)",
            id="no-slots",
        ),
        pytest.param(
            RealizedCache(kind=CacheKind.NONE, max_num_seqs=4, kv_cache_bytes=4096),
            KvBudget(),
            "no KV cache, but 4096 KV bytes",
            id="none-with-bytes",
        ),
    ],
)
def test_an_impossible_report_is_refused_with_its_own_code(realized, budget, fragment):
    reason = check_plausible(realized, CPU, budget)
    assert reason is not None
    assert reason.code is ReasonCode.REALIZED_REPORT_IMPLAUSIBLE
    assert fragment in reason.message


def test_a_capability_without_model_geometry_cannot_vouch_for_a_cache():
    capability = replace(CPU, model=replace(LLAMA, num_layers=0))
    assert check_plausible(HONEST, capability, KvBudget()).code is (
        ReasonCode.REALIZED_REPORT_IMPLAUSIBLE
    )


def test_the_free_memory_bounds_even_a_report_within_the_budget():
    small = replace(CPU, free_memory_bytes=GIB // 1024)
    assert "bytes of memory are free" in check_plausible(HONEST, small, KvBudget()).message
