"""Continuous batching over the block pool: admission by free blocks, preemption by recompute."""

from __future__ import annotations

from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.cache.kv_usage import KVUsage
from intentserve.worker.sched.scheduler import Scheduler
from intentserve.worker.sched.sequence import Sequence, SequenceStatus


class PagedScheduler(Scheduler):
    """When a running sequence cannot get a block, the newest running sequence is preempted:
    its blocks are freed and it goes to the front of the waiting queue, to recompute its prompt
    and the outputs it has so far (the blocks it had computed stay in the prefix cache until
    evicted). If it is the newest itself, it preempts itself.
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        super().__init__(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )
        self.allocator = allocator
        self.num_pool_tokens = allocator.num_blocks * allocator.block_size
        # NOTE: a sequence alone must always fit the pool, or preempting it would never end.
        self.max_num_tokens = min(max_model_len, self.num_pool_tokens)

    def _check_fits(self, seq: Sequence) -> None:
        if seq.num_tokens >= self.num_pool_tokens:
            block_size = self.allocator.block_size
            raise ValueError(
                f"prompt has {seq.num_tokens} tokens: with room for one generated token it "
                f"needs {seq.num_tokens // block_size + 1} blocks of {block_size} tokens, but "
                f"the KV pool has {self.allocator.num_blocks} blocks ({self.num_pool_tokens} "
                "tokens)"
            )

    def _try_allocate(self, seq: Sequence) -> bool:
        parent = seq.fork_of
        if parent is not None and not parent.is_finished:
            # NOTE: it waits for its parent's prompt KV (computed in an earlier step).
            if parent.status is not SequenceStatus.RUNNING or (
                parent.num_computed_tokens < seq.num_prompt_tokens - 1
            ):
                return False
            if not self.allocator.can_fork(parent, seq):
                return False
            self._block_copies += self.allocator.fork(parent, seq)
            seq.fork_of = None
            return True
        seq.fork_of = None  # its parent ended first: it computes its prompt alone
        if not self.allocator.can_allocate(seq):
            return False
        self.allocator.allocate(seq)
        return True

    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[str]) -> bool:
        while not self.allocator.can_append(seq, num_new_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim.seq_id)
            if victim is seq:
                return False
        self.allocator.may_append(seq, num_new_tokens)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.allocator.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _free(self, seq: Sequence) -> None:
        self.allocator.free(seq)

    def _kv_usage(self) -> KVUsage:
        return self.allocator.usage()
