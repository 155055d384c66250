"""PagedScheduler: admission by free blocks, preemption by recompute, prefix-cache hits."""

from __future__ import annotations

import pytest
from intentserve.worker.sched.sequence import FinishReason, SequenceStatus


def _all_blocks_free(scheduler) -> bool:
    allocator = scheduler.allocator
    refs = [allocator.ref_count(block_id) for block_id in range(allocator.num_blocks)]
    return allocator.num_free_blocks == allocator.num_blocks and refs == [0] * len(refs)


def test_the_output_carries_block_tables(paged, new_seq, step):
    scheduler = paged()
    seq = new_seq("a", 40)
    scheduler.add(seq)
    output, _ = step(scheduler)
    (item,) = output.scheduled
    assert item.block_table == tuple(seq.block_table)
    assert len(item.block_table) == 3
    assert item.slot is None


def test_admission_waits_for_free_blocks(paged, new_seq, step, drain):
    scheduler = paged(num_blocks=11, max_num_batched_tokens=256)
    first, second = new_seq("first", 100, max_tokens=3), new_seq("second", 100, first=500)
    scheduler.add(first)
    scheduler.add(second)
    step(scheduler)  # first takes 7 of the 11 blocks; second needs 7
    assert first.status is SequenceStatus.RUNNING
    assert second.status is SequenceStatus.WAITING
    outputs = drain(scheduler)
    step_ids = [{item.seq_id for item in output.scheduled} for output in outputs]
    # first decodes its last two tokens; second is admitted the step after it finished.
    assert step_ids[:3] == [{"first"}, {"first"}, {"second"}]
    assert second.num_output_tokens == 4
    assert _all_blocks_free(scheduler)


def test_the_newest_running_sequence_is_preempted_and_later_completes(
    paged, new_seq, drain, sampled_token
):
    scheduler = paged(num_blocks=6, max_num_batched_tokens=64)
    seqs = [new_seq(f"s{i}", 20, max_tokens=30, first=100 * i) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    outputs = drain(scheduler)
    preempted = [seq_id for output in outputs for seq_id in output.preempted_seq_ids]
    assert preempted and preempted[0] == "s2"  # the newest goes first
    assert scheduler.num_preemptions == len(preempted) == sum(s.num_preemptions for s in seqs)
    for seq in seqs:  # recompute lost nothing and repeated nothing
        assert seq.output_token_ids == [sampled_token(seq.seq_id, 20 + i) for i in range(30)]
        assert seq.finish_reason is FinishReason.LENGTH
    assert _all_blocks_free(scheduler)


def test_a_sequence_that_is_the_newest_preempts_itself(paged, new_seq, step):
    scheduler = paged(num_blocks=4, max_num_batched_tokens=64)
    old, new = new_seq("old", 20, max_tokens=20), new_seq("new", 31, max_tokens=20, first=100)
    waiting = new_seq("waiting", 5, first=200)
    for seq in (old, new):
        scheduler.add(seq)
    step(scheduler)  # both prefilled: 2 blocks each, the pool is full
    scheduler.add(waiting)
    step(scheduler)  # new computes position 31, the last of its second block
    output, _ = step(scheduler)  # new needs a third block and is the newest
    assert output.preempted_seq_ids == ("new",)
    assert [item.seq_id for item in output.scheduled] == ["old"]  # and nobody is admitted
    assert new.status is SequenceStatus.PREEMPTED
    assert (new.num_computed_tokens, new.block_table, new.num_output_tokens) == (0, [], 2)
    assert list(scheduler.waiting) == [new, waiting]  # back at the front
    assert scheduler.stats().num_preemptions == 1


def test_a_preempted_sequence_can_be_aborted(paged, new_seq, step):
    scheduler = paged(num_blocks=4, max_num_batched_tokens=64)
    scheduler.add(new_seq("old", 20, max_tokens=20))
    scheduler.add(new_seq("new", 31, max_tokens=20, first=100))
    for _ in range(3):
        step(scheduler)
    assert scheduler.abort("new")
    assert scheduler.abort("old")
    assert _all_blocks_free(scheduler)


def test_prefix_cache_hits_skip_computation(paged, new_seq, step):
    scheduler = paged()
    prefix = list(range(1000, 1040))
    a = new_seq("a", 0, max_tokens=10)
    a.prompt_token_ids = prefix + [1, 2, 3]
    scheduler.add(a)
    step(scheduler)
    step(scheduler)  # a's step-one blocks are published as it decodes
    b = new_seq("b", 0, max_tokens=10)
    b.prompt_token_ids = prefix + [7, 8, 9, 10, 11]
    scheduler.add(b)
    output, _ = step(scheduler)
    item = next(item for item in output.scheduled if item.seq_id == "b")
    assert (item.start_pos, item.num_new_tokens) == (32, 13)
    assert item.block_table[:2] == tuple(a.block_table[:2])
    assert b.num_cached_tokens == 32
    assert scheduler.stats().kv.num_prefix_hit_tokens == 32


def test_a_prompt_that_can_never_fit_the_pool_is_rejected_with_the_numbers(paged, new_seq):
    scheduler = paged(num_blocks=11, block_size=16, max_model_len=1000)
    with pytest.raises(
        ValueError, match=r"176 tokens.* 12 blocks of 16 tokens.* 11 blocks \(176 tokens\)"
    ):
        scheduler.add(new_seq("a", 176))
    scheduler.add(new_seq("b", 175))


def test_a_sequence_stops_at_the_pool_capacity_instead_of_thrashing(paged, new_seq, drain):
    scheduler = paged(num_blocks=4, block_size=16, max_model_len=1000)
    seq = new_seq("a", 10, max_tokens=1000)
    scheduler.add(seq)
    drain(scheduler)
    assert (seq.num_tokens, seq.finish_reason) == (64, FinishReason.LENGTH)
    assert scheduler.num_preemptions == 0
    assert _all_blocks_free(scheduler)


def test_stats_report_blocks_and_live_tokens(paged, new_seq, step):
    scheduler = paged(num_blocks=11, block_size=16)
    scheduler.add(new_seq("a", 20))
    scheduler.add(new_seq("b", 5, first=100))
    step(scheduler)
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_preemptions) == (2, 0, 0)
    assert (stats.kv.num_blocks, stats.kv.num_used_blocks, stats.kv.num_free_blocks) == (11, 3, 8)
    assert (stats.kv.num_live_tokens, stats.kv.num_reserved_tokens) == (25, 48)
