"""The KV block pool: a free list, reference counts and hash-based prefix caching of full blocks.

Pure Python. It hands out block ids and knows nothing of tensors or of the model; the model
runner maps a block id to its rows of the KV tensors.

Prefix caching: a FULL block whose tokens have been computed is published under the key
(hash of the previous block's key, its token ids), so the key names the whole prefix up to and
including the block. A later sequence whose prompt starts with the same tokens reuses the block
(its reference count goes up) and skips computing those tokens. A freed block keeps its key
and stays reusable until the pool needs a free block and evicts it: blocks that hold no cached
prefix go first, then cached ones, least recently freed first.

Blocks that hold no cached prefix are handed out most recently freed first (a stack), and the
never-used ones last: the KV pool's pages are only touched when a token is written, so the
memory really in use follows the work in flight, not the number of requests served. (With
prefix caching, cached prefixes still fill the pool over time: that is the cache, and the pool
is sized within the memory the worker can use.)

Fork (n samples of one prompt): a new sequence with the same prompt shares the full blocks its
parent has computed by reference count, with or without prefix caching. The block holding the
next position it writes, when the parent has filled it only in part, is copied before it writes
(copy on write): `fork` returns that copy as a (source, destination) pair of block ids, for the
model runner to make before the step's forward.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from intentserve.worker.cache.kv_usage import KVUsage

if TYPE_CHECKING:
    from intentserve.worker.sched.sequence import Sequence

# (hash of the previous block's key or None for the first block, the block's token ids)
BlockKey = tuple[int | None, tuple[int, ...]]
# (source block id, destination block id): the KV rows the model runner copies before a step
BlockCopy = tuple[int, int]


class BlockAllocatorError(RuntimeError):
    """A broken invariant: double free, a negative reference count, acting without checking."""


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_count: int = 0
    num_tokens: int = 0  # token positions it holds for its sequences (block_size when full)
    key: BlockKey | None = None  # set once full and computed, with prefix caching on


class BlockAllocator:
    """Blocks of `block_size` tokens; a sequence's blocks are its `block_table` (a list of ids).

    Out of blocks is an answer (`can_allocate` / `can_append` return False), never an exception:
    the scheduler then preempts. Acting without room raises `BlockAllocatorError`.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be at least 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(block_id) for block_id in range(num_blocks)]
        # NOTE: every block with ref_count 0 is in exactly one of the two free collections.
        # A stack: the top is the block freed last; block 0 is on top of the never-used ones.
        self._free_uncached: list[int] = list(reversed(range(num_blocks)))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._cached: dict[BlockKey, int] = {}  # key -> the block published under it
        self._num_live_tokens = 0
        self._num_prefix_queried_tokens = 0
        self._num_prefix_hit_tokens = 0

    # -- check/act pairs -------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether the blocks for all of `seq`'s tokens (prompt and any outputs) are available."""
        hit_ids = self._find_cached_blocks(seq)
        num_revived = sum(1 for block_id in hit_ids if self._blocks[block_id].ref_count == 0)
        num_new = self._num_blocks_for(seq.num_tokens) - len(hit_ids)
        return num_new + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Assigns blocks for all of `seq`'s tokens, reusing cached full blocks of its prefix.

        Sets `seq.block_table` and `seq.num_cached_tokens` (the tokens it need not compute).
        """
        if seq.block_table:
            raise BlockAllocatorError(f"sequence {seq.seq_id!r} already holds blocks")
        if not self.can_allocate(seq):
            raise BlockAllocatorError(f"allocate({seq.seq_id!r}) without room; check first")
        hit_ids = self._find_cached_blocks(seq)
        # NOTE: take the hits before any new block, or taking one could evict a hit.
        for block_id in hit_ids:
            self._share(self._blocks[block_id])
        seq.block_table = list(hit_ids)
        seq.num_cached_tokens = len(hit_ids) * self.block_size
        self._num_prefix_queried_tokens += seq.num_tokens
        self._num_prefix_hit_tokens += seq.num_cached_tokens
        self._hold_tokens(seq, seq.num_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether `seq` can hold `num_new_tokens` more computed tokens."""
        return self._num_missing_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def may_append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grows `seq`'s block table to hold `num_new_tokens` beyond its computed tokens.

        Also publishes the blocks that have become full of computed tokens since the last call.
        NOTE: a block is published only once its KV is computed (in an earlier step), so a hit
        never depends on the order in which the model runner writes and reads one batch.
        """
        if not seq.block_table:
            raise BlockAllocatorError(f"may_append({seq.seq_id!r}) before allocate")
        if not self.can_append(seq, num_new_tokens):
            raise BlockAllocatorError(f"may_append({seq.seq_id!r}) without room; check first")
        self._publish_computed_blocks(seq)
        self._hold_tokens(seq, seq.num_computed_tokens + num_new_tokens)

    def can_fork(self, parent: Sequence, child: Sequence) -> bool:
        """Whether `child` can share `parent`'s computed prompt (see `fork`)."""
        num_new = self._num_blocks_for(child.num_tokens) - self._num_forked_tokens(parent, child)[0]
        return num_new <= self.num_free_blocks

    def fork(self, parent: Sequence, child: Sequence) -> tuple[BlockCopy, ...]:
        """Assigns blocks for all of `child`'s tokens, sharing those of `parent`'s computed
        prompt that it need not compute (all but its last token, which gives it logits).

        `child` holds no blocks and has `parent`'s prompt. Its full blocks are shared; the
        block it writes next, if `parent` filled it in part, is a new block the returned copy
        fills. Sets `child.num_cached_tokens` (the tokens it need not compute).
        """
        if child.block_table:
            raise BlockAllocatorError(f"sequence {child.seq_id!r} already holds blocks")
        if child.prompt_token_ids != parent.prompt_token_ids:
            raise BlockAllocatorError(f"fork({child.seq_id!r}): its prompt is not its parent's")
        if not self.can_fork(parent, child):
            raise BlockAllocatorError(f"fork({child.seq_id!r}) without room; check first")
        num_full, num_shared = self._num_forked_tokens(parent, child)
        for block_id in parent.block_table[:num_full]:
            self._share(self._blocks[block_id])
        child.block_table = parent.block_table[:num_full]
        child.num_cached_tokens = num_shared
        copies: tuple[BlockCopy, ...] = ()
        if num_shared > num_full * self.block_size:
            copy = self._take_free_block()
            copy.num_tokens = num_shared - num_full * self.block_size
            self._num_live_tokens += copy.num_tokens
            child.block_table.append(copy.block_id)
            copies = ((parent.block_table[num_full], copy.block_id),)
        self._hold_tokens(child, child.num_tokens)
        return copies

    def free(self, seq: Sequence) -> None:
        """Releases `seq`'s blocks; those full of computed tokens stay cached until evicted."""
        if not seq.block_table:
            raise BlockAllocatorError(
                f"free({seq.seq_id!r}): it holds no blocks (double free, or never allocated)"
            )
        self._publish_computed_blocks(seq)
        # Released last block first, so a prefix's tail is evicted before its head.
        for block_id in reversed(seq.block_table):
            self._release(self._blocks[block_id])
        seq.block_table = []

    # -- stats -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def usage(self) -> KVUsage:
        return KVUsage(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            num_used_blocks=self.num_blocks - self.num_free_blocks,
            num_live_tokens=self._num_live_tokens,
            num_cached_blocks=len(self._free_cached),
            num_prefix_queried_tokens=self._num_prefix_queried_tokens,
            num_prefix_hit_tokens=self._num_prefix_hit_tokens,
        )

    # -- internals -------------------------------------------------------------------------

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _num_missing_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        num_needed = self._num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, num_needed - len(seq.block_table))

    def _num_forked_tokens(self, parent: Sequence, child: Sequence) -> tuple[int, int]:
        """(full blocks shared, tokens taken) when `child` forks from `parent`."""
        num_shared = min(parent.num_computed_tokens, child.num_prompt_tokens - 1)
        return num_shared // self.block_size, num_shared

    def _key(self, parent: BlockKey | None, seq: Sequence, index: int) -> BlockKey:
        start = index * self.block_size
        token_ids = tuple(seq.get_token_ids(start, start + self.block_size))
        return (None if parent is None else hash(parent), token_ids)

    def _find_cached_blocks(self, seq: Sequence) -> list[int]:
        """Ids of the published blocks that hold `seq`'s leading full blocks."""
        if not self.enable_prefix_caching or not seq.reuses_prefix_cache:
            return []
        # NOTE: never a hit on the last token: the model must compute one to produce logits.
        num_candidates = (seq.num_tokens - 1) // self.block_size
        hit_ids: list[int] = []
        key = None
        for index in range(num_candidates):
            key = self._key(key, seq, index)
            block_id = self._cached.get(key)
            if block_id is None:
                break
            hit_ids.append(block_id)
        return hit_ids

    def _publish_computed_blocks(self, seq: Sequence) -> None:
        if not self.enable_prefix_caching:
            return
        table = seq.block_table
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        # NOTE: published blocks are a prefix of the table: walk back to its end.
        first = num_full
        while first > 0 and self._blocks[table[first - 1]].key is None:
            first -= 1
        key = self._blocks[table[first - 1]].key if first > 0 else None
        for index in range(first, num_full):
            key = self._key(key, seq, index)
            block = self._blocks[table[index]]
            block.key = key
            # Same tokens computed twice (no hit when it was admitted): the first block stays.
            self._cached.setdefault(key, block.block_id)

    def _hold_tokens(self, seq: Sequence, num_tokens: int) -> None:
        """Grows `seq`'s blocks (the last one, then new ones) to hold `num_tokens` positions."""
        table = seq.block_table
        num_held = 0
        if table:
            last = self._blocks[table[-1]]
            num_held = (len(table) - 1) * self.block_size + last.num_tokens
            extra = min(self.block_size - last.num_tokens, num_tokens - num_held)
            if extra > 0:  # NOTE: a block that is not full is never shared (fork copies it)
                last.num_tokens += extra
                self._num_live_tokens += extra
                num_held += extra
        while num_held < num_tokens:
            block = self._take_free_block()
            block.num_tokens = min(self.block_size, num_tokens - num_held)
            self._num_live_tokens += block.num_tokens
            num_held += block.num_tokens
            table.append(block.block_id)

    def _take_free_block(self) -> _Block:
        if self._free_uncached:
            block = self._blocks[self._free_uncached.pop()]
        elif self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            block = self._blocks[block_id]
            del self._cached[block.key]  # evicted: its prefix is no longer reusable
            block.key = None
        else:
            raise BlockAllocatorError("no free block; callers must check first")
        block.ref_count = 1
        block.num_tokens = 0
        return block

    def _share(self, block: _Block) -> None:
        if block.ref_count == 0:
            del self._free_cached[block.block_id]
            self._num_live_tokens += block.num_tokens
        block.ref_count += 1

    def _release(self, block: _Block) -> None:
        if block.ref_count <= 0:
            raise BlockAllocatorError(
                f"block {block.block_id} released with reference count {block.ref_count}"
            )
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        self._num_live_tokens -= block.num_tokens
        if block.key is not None and self._cached.get(block.key) == block.block_id:
            self._free_cached[block.block_id] = None
        else:
            block.key = None
            self._free_uncached.append(block.block_id)
