"""Fork: sequences with one prompt share its computed full blocks; the part-filled block that a
fork writes next is copied first."""

from __future__ import annotations

import pytest
from intentserve.worker.cache.block_allocator import BlockAllocator, BlockAllocatorError
from intentserve.worker.sched.sequence import Sequence

PROMPT = list(range(100, 137))  # 37 tokens: two full blocks of 16, and 5 more


@pytest.fixture
def uncached() -> BlockAllocator:
    return BlockAllocator(num_blocks=11, block_size=16, enable_prefix_caching=False)


def _parent(allocator: BlockAllocator, compute, prompt: list[int]) -> Sequence:
    """A sequence whose prompt, less its last token, has been computed."""
    parent = Sequence("parent", list(prompt), max_tokens=8)
    allocator.allocate(parent)
    compute(allocator, parent, len(prompt) - 1)
    return parent


def test_forks_share_the_full_blocks_and_copy_the_part_filled_one(uncached, compute):
    parent = _parent(uncached, compute, PROMPT)
    assert uncached.usage().num_used_blocks == 3
    children = [Sequence(f"c{i}", list(PROMPT), max_tokens=8) for i in range(3)]
    copies = []
    for child in children:
        assert uncached.can_fork(parent, child)
        copies += uncached.fork(parent, child)
    for child in children:
        assert child.block_table[:2] == parent.block_table[:2]
        assert child.num_cached_tokens == len(PROMPT) - 1
    assert [uncached.ref_count(b) for b in parent.block_table] == [4, 4, 1]
    # Each child's third block is a copy of the parent's, which only the parent still holds.
    assert copies == [(parent.block_table[2], c.block_table[2]) for c in children]
    assert len({c.block_table[2] for c in children} | {parent.block_table[2]}) == 4
    usage = uncached.usage()
    assert usage.num_used_blocks == 2 + 4  # the full blocks once, a third block each
    assert usage.num_live_tokens == 32 + 4 * 5
    for seq in (parent, *children):
        compute(uncached, seq, seq.num_uncomputed_tokens)  # the last prompt token: no new block
        assert len(seq.block_table) == 3
    for seq in (*children, parent):
        uncached.free(seq)
    assert uncached.num_free_blocks == 11
    assert all(uncached.ref_count(b) == 0 for b in range(11))
    assert uncached.usage().num_live_tokens == 0


def test_a_fork_at_a_block_boundary_copies_nothing(uncached, compute):
    prompt = PROMPT[:33]  # 32 computed tokens: two full blocks; the last token starts a third
    parent = _parent(uncached, compute, prompt)
    child = Sequence("child", list(prompt), max_tokens=8)
    assert uncached.fork(parent, child) == ()
    assert child.block_table[:2] == parent.block_table[:2]
    assert child.block_table[2] != parent.block_table[2]
    assert uncached.usage().num_used_blocks == 4


def test_a_fork_without_room_is_an_answer_then_an_error(compute):
    allocator = BlockAllocator(num_blocks=3, block_size=16, enable_prefix_caching=False)
    parent = _parent(allocator, compute, PROMPT)
    child = Sequence("child", list(PROMPT), max_tokens=8)
    assert not allocator.can_fork(parent, child)
    with pytest.raises(BlockAllocatorError, match="without room"):
        allocator.fork(parent, child)
    assert allocator.usage().num_used_blocks == 3


def test_a_fork_must_have_its_parents_prompt(uncached, compute):
    parent = _parent(uncached, compute, PROMPT)
    with pytest.raises(BlockAllocatorError, match="not its parent's"):
        uncached.fork(parent, Sequence("other", PROMPT[:-1] + [1], max_tokens=8))


def test_forked_blocks_are_published_once_with_prefix_caching(allocator, compute, decode):
    parent = _parent(allocator, compute, PROMPT)
    child = Sequence("child", list(PROMPT), max_tokens=8)
    allocator.fork(parent, child)
    decode(allocator, parent)
    decode(allocator, child)
    decode(allocator, parent)
    decode(allocator, child)  # both publish the two shared blocks: one key each
    later = Sequence("later", list(PROMPT), max_tokens=8)
    allocator.allocate(later)
    assert later.num_cached_tokens == 32
    assert later.block_table[:2] == parent.block_table[:2]
    for seq in (parent, child, later):
        allocator.free(seq)
    assert allocator.num_free_blocks == 11
