"""Helpers for driving the block allocator by hand: the tests play the scheduler."""

from __future__ import annotations

import pytest
from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.sched.sequence import Sequence


def _compute(allocator: BlockAllocator, seq: Sequence, num_tokens: int) -> None:
    """What one engine step does to `seq`: make room, then the KV of num_tokens is written."""
    assert allocator.can_append(seq, num_tokens)
    allocator.may_append(seq, num_tokens)
    seq.num_computed_tokens += num_tokens


def _decode(allocator: BlockAllocator, seq: Sequence, token_id: int = 7) -> None:
    """Computes everything outstanding, then samples one token (not computed yet)."""
    _compute(allocator, seq, seq.num_uncomputed_tokens)
    seq.output_token_ids.append(token_id)


@pytest.fixture(scope="session")
def compute():
    return _compute


@pytest.fixture(scope="session")
def decode():
    return _decode


@pytest.fixture
def allocator() -> BlockAllocator:
    """The tiny pool of the tests: 11 blocks of 16 tokens, prefix caching on."""
    return BlockAllocator(num_blocks=11, block_size=16, enable_prefix_caching=True)
