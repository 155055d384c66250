"""Hash-based prefix caching of full blocks: sharing, the last-token rule, LRU eviction."""

from __future__ import annotations

from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.sched.sequence import Sequence

PREFIX = list(range(1000, 1040))  # 40 tokens: two full blocks of 16, and 8 more


def _seq(seq_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(seq_id, token_ids, max_tokens=100)


def _unique(first: int, num_tokens: int) -> list[int]:
    return list(range(first, first + num_tokens))


def test_two_sequences_share_the_full_blocks_of_a_common_prefix(allocator, decode):
    a = _seq("a", PREFIX + _unique(1, 5))
    allocator.allocate(a)
    decode(allocator, a)
    decode(allocator, a)  # the next step publishes what the first one computed
    b = _seq("b", PREFIX + _unique(500, 5))
    allocator.allocate(b)
    assert b.num_cached_tokens == 32
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [allocator.ref_count(block_id) for block_id in b.block_table] == [2, 2, 1]
    usage = allocator.usage()
    assert usage.num_prefix_hit_tokens == 32
    assert usage.num_used_blocks == 4
    assert usage.num_live_tokens == a.num_computed_tokens + (b.num_tokens - 32)  # shared once
    allocator.free(a)
    allocator.free(b)
    assert all(allocator.ref_count(block_id) == 0 for block_id in range(11))
    assert allocator.num_free_blocks == 11


def test_the_last_prompt_token_is_never_a_hit(allocator, decode):
    a = _seq("a", _unique(0, 32))
    allocator.allocate(a)
    decode(allocator, a)
    allocator.free(a)  # frees publish too: both blocks are cached
    assert allocator.usage().num_cached_blocks == 2
    same = _seq("same", _unique(0, 32))
    allocator.allocate(same)
    assert same.num_cached_tokens == 16  # the second block holds the last token
    one_more = _seq("one_more", _unique(0, 33))
    allocator.allocate(one_more)
    assert one_more.num_cached_tokens == 32


def test_blocks_are_published_only_once_computed(allocator, compute):
    a = _seq("a", PREFIX)
    allocator.allocate(a)
    compute(allocator, a, 16)  # a chunk: block 0 is computed, block 1 is not
    compute(allocator, a, 8)  # the next chunk's step publishes block 0
    b = _seq("b", PREFIX)
    allocator.allocate(b)
    assert b.num_cached_tokens == 16


def test_a_freed_block_stays_cached_until_evicted_least_recently_used_first(allocator, decode):
    a = _seq("a", PREFIX)
    allocator.allocate(a)
    decode(allocator, a)
    allocator.free(a)
    # Nine uncached blocks go first, then the cached tail (freed first), then the head.
    filler = _seq("filler", _unique(5000, 10 * 16))
    allocator.allocate(filler)
    allocator.free(filler)
    b = _seq("b", PREFIX)
    allocator.allocate(b)
    assert b.num_cached_tokens == 16  # block 1 was evicted and is not hit again
    allocator.free(b)
    filler = _seq("filler2", _unique(5000, 11 * 16 - 1))
    allocator.allocate(filler)
    allocator.free(filler)
    c = _seq("c", PREFIX)
    allocator.allocate(c)
    assert c.num_cached_tokens == 0


def test_a_hit_on_a_free_cached_block_needs_it_counted_as_taken(allocator, decode):
    a = _seq("a", PREFIX[:33])
    allocator.allocate(a)
    decode(allocator, a)
    allocator.free(a)
    filler = _seq("filler", _unique(5000, 9 * 16))
    allocator.allocate(filler)
    assert allocator.num_free_blocks == 2  # a's two cached blocks
    b = _seq("b", PREFIX[:33])  # two hits, but both revive free blocks, plus one new block
    assert not allocator.can_allocate(b)
    allocator.free(filler)
    assert allocator.can_allocate(b)


def test_the_same_tokens_computed_twice_cache_one_block(allocator, decode):
    a, b = _seq("a", PREFIX), _seq("b", PREFIX)
    allocator.allocate(a)
    allocator.allocate(b)  # admitted together: nothing was computed yet, no hit
    assert b.num_cached_tokens == 0
    for seq in (a, b):
        decode(allocator, seq)
        decode(allocator, seq)
    a_blocks = a.block_table[:2]  # published first: the cache keeps these
    allocator.free(a)
    allocator.free(b)
    assert allocator.usage().num_cached_blocks == 2
    assert allocator.num_free_blocks == 11
    c = _seq("c", PREFIX)
    allocator.allocate(c)
    assert c.num_cached_tokens == 32
    assert c.block_table[:2] == a_blocks


def test_a_preempted_sequence_hits_its_own_blocks(allocator, decode):
    a = _seq("a", PREFIX)
    allocator.allocate(a)
    for _ in range(10):
        decode(allocator, a)
    allocator.free(a)
    a.num_computed_tokens = 0  # recompute prompt and outputs, 50 tokens
    allocator.allocate(a)
    assert a.num_cached_tokens == 48


def test_no_hits_with_prefix_caching_off(decode):
    allocator = BlockAllocator(num_blocks=11, block_size=16, enable_prefix_caching=False)
    a = _seq("a", PREFIX)
    allocator.allocate(a)
    decode(allocator, a)
    decode(allocator, a)
    b = _seq("b", PREFIX)
    allocator.allocate(b)
    assert b.num_cached_tokens == 0
    allocator.free(a)
    assert allocator.usage().num_cached_blocks == 0
