"""The KV budget is physical: more than the memory this worker can use is a start-up error that
names the setting and gives the numbers (a tiny random model: the fast layer)."""

from __future__ import annotations

import pytest
import torch
from intentserve.policy import ReasonCode
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.kv_setup import KvBudgetTooLargeError
from intentserve.worker.memory import device_memory
from intentserve.worker.runtime.lifecycle import load_error_reason

GIB = 1 << 30


def build(loaded, kv_bytes: int):
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=kv_bytes)
        .scheduler(max_model_len=128)
        .build(loaded=loaded)
    )


@pytest.mark.parametrize("over", ["1Ti", "usable + 1Gi"])
def test_a_kv_budget_beyond_the_usable_memory_is_refused_with_the_numbers(tiny_loaded, over):
    usable = device_memory(torch.device("cpu")).usable_bytes
    kv_bytes = 1 << 40 if over == "1Ti" else usable + GIB
    if kv_bytes <= usable:
        pytest.skip(f"this machine can use {usable} bytes, more than 1 TiB")
    with pytest.raises(KvBudgetTooLargeError) as info:
        build(tiny_loaded, kv_bytes)
    message = str(info.value)
    assert "kv_cache_memory (spec.pagedAttention.kvCacheMemory)" in message
    assert f"asks for {kv_bytes} bytes" in message
    assert "this worker can use at most " in message
    reason = load_error_reason(info.value)
    assert (reason.code, reason.message) == (ReasonCode.KV_BUDGET_TOO_LARGE, message)


def test_the_report_states_the_bytes_really_allocated(tiny_loaded):
    engine = build(tiny_loaded, 1 << 20)
    pool_bytes = sum(
        t.nbytes for t in (*engine.runner.attention.pool.k, *engine.runner.attention.pool.v)
    )
    assert engine.realized.cache.kv_cache_bytes == pool_bytes == 1 << 20


@pytest.mark.parametrize("mode", ["on", "off"])
def test_the_report_states_the_sequences_the_scheduler_runs_at_once(tiny_loaded, mode):
    """The controller admits as many requests per worker as this number (its sequence slots):
    the scheduler's, not how many sequences of max length the pool could hold."""
    engine = (
        EngineBuilder()
        .paged_attention(mode)
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=128, max_num_seqs=5)
        .build(loaded=tiny_loaded)
    )
    assert engine.realized.cache.max_num_seqs == engine.scheduler.max_num_seqs
    if mode == "on":
        assert engine.realized.cache.max_num_seqs == 5
