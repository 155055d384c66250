"""BlockAllocator: free list, reference counts, growth, stats and its invariants."""

from __future__ import annotations

import pytest
from intentserve.worker.cache.block_allocator import BlockAllocator, BlockAllocatorError
from intentserve.worker.sched.sequence import Sequence


def _seq(seq_id: str, num_tokens: int, first_token: int = 0) -> Sequence:
    return Sequence(seq_id, list(range(first_token, first_token + num_tokens)), max_tokens=100)


def test_allocate_covers_every_prompt_token(allocator):
    seq = _seq("a", 20)
    assert allocator.can_allocate(seq)
    allocator.allocate(seq)
    assert len(seq.block_table) == 2
    assert len(set(seq.block_table)) == 2
    assert seq.num_cached_tokens == 0
    assert allocator.num_free_blocks == 9
    assert all(allocator.ref_count(block_id) == 1 for block_id in seq.block_table)


def test_may_append_grows_only_when_a_block_fills(allocator, compute, decode):
    seq = _seq("a", 31)
    allocator.allocate(seq)
    decode(allocator, seq)  # 32 tokens: the sampled one still fits block 1
    compute(allocator, seq, 1)
    assert len(seq.block_table) == 2
    seq.output_token_ids.append(8)  # the 33rd token needs a third block
    assert allocator.can_append(seq, 1)
    compute(allocator, seq, 1)
    assert len(seq.block_table) == 3
    assert allocator.num_free_blocks == 8


def test_free_returns_every_block_and_zeroes_ref_counts(allocator, decode):
    seqs = [_seq(f"s{i}", 30, first_token=100 * i) for i in range(3)]
    for seq in seqs:
        allocator.allocate(seq)
        decode(allocator, seq)
    for seq in seqs:
        allocator.free(seq)
        assert seq.block_table == []
    assert allocator.num_free_blocks == 11
    assert all(allocator.ref_count(block_id) == 0 for block_id in range(11))
    assert allocator.usage().num_live_tokens == 0


def test_out_of_blocks_is_an_answer_not_an_exception(allocator):
    big = _seq("big", 10 * 16)
    allocator.allocate(big)
    assert allocator.num_free_blocks == 1
    assert not allocator.can_allocate(_seq("b", 17))
    assert allocator.can_allocate(_seq("c", 16))
    big.num_computed_tokens = big.num_tokens
    assert allocator.can_append(big, 16)
    assert not allocator.can_append(big, 17)


def test_acting_without_room_is_a_broken_invariant(allocator):
    big = _seq("big", 11 * 16)
    allocator.allocate(big)
    with pytest.raises(BlockAllocatorError, match="without room"):
        allocator.allocate(_seq("b", 1))
    big.num_computed_tokens = big.num_tokens
    with pytest.raises(BlockAllocatorError, match="without room"):
        allocator.may_append(big, 1)


def test_double_free_raises(allocator):
    seq = _seq("a", 20)
    allocator.allocate(seq)
    allocator.free(seq)
    with pytest.raises(BlockAllocatorError, match="double free"):
        allocator.free(seq)


def test_releasing_a_block_below_zero_raises(allocator):
    seq = _seq("a", 20)
    allocator.allocate(seq)
    stale = _seq("stale", 20)
    stale.block_table = list(seq.block_table)
    allocator.free(seq)
    with pytest.raises(BlockAllocatorError, match="reference count 0"):
        allocator.free(stale)


def test_allocate_twice_and_append_before_allocate_raise(allocator):
    seq = _seq("a", 20)
    with pytest.raises(BlockAllocatorError, match="before allocate"):
        allocator.may_append(seq, 1)
    allocator.allocate(seq)
    with pytest.raises(BlockAllocatorError, match="already holds blocks"):
        allocator.allocate(seq)


def test_usage_counts_live_tokens_against_reserved_capacity(allocator, compute):
    seq = _seq("a", 20)
    allocator.allocate(seq)
    usage = allocator.usage()
    assert (usage.num_blocks, usage.num_used_blocks, usage.num_free_blocks) == (11, 2, 9)
    assert (usage.num_live_tokens, usage.num_reserved_tokens, usage.num_wasted_tokens) == (
        20,
        32,
        12,
    )
    compute(allocator, seq, 20)
    seq.output_token_ids.extend([1] * 13)
    compute(allocator, seq, 13)
    usage = allocator.usage()
    assert (usage.num_used_blocks, usage.num_live_tokens) == (3, 33)
    assert usage.usage == pytest.approx(3 / 11)


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_empty_pool_is_rejected(num_blocks, block_size):
    with pytest.raises(ValueError, match="must be at least 1"):
        BlockAllocator(num_blocks, block_size, enable_prefix_caching=False)


@pytest.mark.parametrize(
    ("prefix_caching", "num_prompt_tokens", "num_at_once"),
    [(False, 40, 1), (False, 40, 4), (True, 10, 4)],  # with caching: no full block gets cached
)
def test_a_stream_of_small_requests_touches_a_bounded_set_of_blocks(
    compute, decode, prefix_caching, num_prompt_tokens, num_at_once
):
    """Recently freed blocks are reused first, so the blocks ever written (the KV memory really
    touched) follow the work in flight, not the number of requests served."""
    allocator = BlockAllocator(num_blocks=1000, block_size=16, enable_prefix_caching=prefix_caching)
    touched: set[int] = set()
    for wave in range(100):
        seqs = [
            _seq(f"s{wave}-{i}", num_prompt_tokens, first_token=1000 * (wave * num_at_once + i))
            for i in range(num_at_once)
        ]
        for seq in seqs:
            allocator.allocate(seq)
            decode(allocator, seq)
            compute(allocator, seq, 1)
            touched |= set(seq.block_table)
        for seq in seqs:
            allocator.free(seq)
    blocks_per_seq = -(-(num_prompt_tokens + 1) // 16)
    assert len(touched) == num_at_once * blocks_per_seq
