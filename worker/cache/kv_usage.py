"""A snapshot of how much KV cache is in use: what the engine reports and the scheduler reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVUsage:
    """KV cache occupancy, for a block pool or for contiguous slots.

    A contiguous cache reports each slot as one block of `max_model_len` tokens, so both caches
    answer the same questions: how full, and how much of what is reserved holds real tokens.
    """

    num_blocks: int
    block_size: int  # tokens per block (per slot for a contiguous cache)
    num_used_blocks: int
    num_live_tokens: int  # token positions of live sequences held in used blocks; shared once
    num_cached_blocks: int = 0  # free blocks still holding a reusable prefix (evictable)
    num_prefix_queried_tokens: int = 0  # cumulative: tokens looked up in the prefix cache
    num_prefix_hit_tokens: int = 0  # cumulative: tokens whose KV was reused, not computed

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    @property
    def num_reserved_tokens(self) -> int:
        """Token capacity of the used blocks."""
        return self.num_used_blocks * self.block_size

    @property
    def num_wasted_tokens(self) -> int:
        """Reserved but holding no token: the KV waste."""
        return self.num_reserved_tokens - self.num_live_tokens

    @property
    def usage(self) -> float:
        """Fraction of the blocks in use, 0.0 to 1.0."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0
