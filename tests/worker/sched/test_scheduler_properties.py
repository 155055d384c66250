"""Property: any interleaving of add / step / abort keeps the KV accounting exact.

Never a leaked or double-counted block, never a step over the token budget, and once every
sequence is done all blocks are free with reference count zero.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st
from intentserve.worker.sched.paged_scheduler import PagedScheduler
from intentserve.worker.sched.sequence import FinishReason, Sequence, SequenceStatus

SHARED_PREFIX = list(range(10_000, 10_100))  # prompts draw on it so that prefix hits happen

_add = st.tuples(
    st.just("add"),
    st.integers(1, 1000),  # prompt length, wrapped to what the scheduler accepts
    st.booleans(),  # whether the prompt is a prefix of SHARED_PREFIX
    st.integers(1, 30),  # max_tokens
)
_step = st.tuples(st.just("step"))
_abort = st.tuples(st.just("abort"), st.integers(0, 50))
_ops = st.lists(st.one_of(_add, _step, _step, _step, _abort), min_size=5, max_size=80)


def _check_kv(scheduler) -> None:
    assert len(scheduler.running) <= scheduler.max_num_seqs
    for seq in scheduler.waiting:
        assert not seq.block_table and seq.slot is None
        assert seq.status in (SequenceStatus.WAITING, SequenceStatus.PREEMPTED)
    if not isinstance(scheduler, PagedScheduler):
        slots = [seq.slot for seq in scheduler.running]
        assert None not in slots and len(set(slots)) == len(slots)
        assert scheduler.stats().kv.num_used_blocks == len(slots)
        return
    allocator = scheduler.allocator
    expected = Counter(block_id for seq in scheduler.running for block_id in seq.block_table)
    for seq in scheduler.running:
        assert len(seq.block_table) == len(set(seq.block_table))
        assert len(seq.block_table) * allocator.block_size >= seq.num_computed_tokens
    for block_id in range(allocator.num_blocks):
        assert allocator.ref_count(block_id) == expected[block_id]
    assert allocator.num_free_blocks == allocator.num_blocks - len(expected)
    usage = allocator.usage()
    assert 0 <= usage.num_live_tokens <= usage.num_reserved_tokens


def _run(scheduler, ops, step) -> None:
    seqs: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, num_tokens, shared, max_tokens = op
            num_tokens = 1 + num_tokens % (scheduler.max_num_tokens - 1)
            prompt = SHARED_PREFIX[:num_tokens] if shared else [len(seqs)] * num_tokens
            seq = Sequence(f"s{len(seqs)}", prompt, max_tokens=max_tokens)
            scheduler.add(seq)
            seqs.append(seq)
        elif op[0] == "step":
            output, _ = step(scheduler)
            assert output.num_batched_tokens <= scheduler.max_num_batched_tokens
            assert all(item.num_new_tokens >= 1 for item in output.scheduled)
        elif seqs:
            scheduler.abort(seqs[op[1] % len(seqs)].seq_id)
        _check_kv(scheduler)
    for _ in range(10_000):
        if not scheduler.num_unfinished:
            break
        step(scheduler)
        _check_kv(scheduler)
    assert scheduler.num_unfinished == 0, "the scheduler stopped making progress"
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED
        assert seq.num_output_tokens <= seq.max_tokens
        if seq.finish_reason is FinishReason.LENGTH:
            assert seq.num_output_tokens == min(
                seq.max_tokens, scheduler.max_num_tokens - seq.num_prompt_tokens
            )
    assert not scheduler.running and not scheduler.waiting
    assert scheduler.stats().kv.num_used_blocks == 0
    assert scheduler.stats().kv.num_live_tokens == 0


@settings(max_examples=300, deadline=None)
@given(
    ops=_ops,
    num_blocks=st.integers(2, 12),
    block_size=st.sampled_from([2, 4, 16]),
    max_num_seqs=st.integers(1, 5),
    max_num_batched_tokens=st.integers(1, 40),
    enable_prefix_caching=st.booleans(),
)
def test_paged_interleavings_never_leak_blocks(
    paged,
    step,
    ops,
    num_blocks,
    block_size,
    max_num_seqs,
    max_num_batched_tokens,
    enable_prefix_caching,
):
    scheduler = paged(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=80,
        enable_prefix_caching=enable_prefix_caching,
    )
    _run(scheduler, ops, step)
    event("preempted" if scheduler.num_preemptions else "no preemption")
    event("prefix hits" if scheduler.stats().kv.num_prefix_hit_tokens else "no prefix hits")
    allocator = scheduler.allocator
    assert allocator.num_free_blocks == num_blocks
    assert all(allocator.ref_count(block_id) == 0 for block_id in range(num_blocks))


@settings(max_examples=100, deadline=None)
@given(
    ops=_ops,
    num_slots=st.integers(1, 4),
    max_num_batched_tokens=st.integers(1, 40),
)
def test_default_interleavings_never_leak_slots(
    default, step, ops, num_slots, max_num_batched_tokens
):
    scheduler = default(
        num_slots=num_slots, max_model_len=80, max_num_batched_tokens=max_num_batched_tokens
    )
    _run(scheduler, ops, step)
    kv = scheduler.stats().kv
    assert (kv.num_blocks, kv.num_used_blocks, kv.num_live_tokens) == (num_slots, 0, 0)
