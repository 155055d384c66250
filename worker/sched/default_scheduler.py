"""The scheduler over the contiguous cache: each running sequence owns one max-length slot."""

from __future__ import annotations

import heapq

from intentserve.worker.cache.kv_usage import KVUsage
from intentserve.worker.sched.scheduler import Scheduler
from intentserve.worker.sched.sequence import Sequence


class DefaultScheduler(Scheduler):
    """Admission by free slot, lowest slot first. A slot reserves max_model_len tokens up front,
    so a running sequence never runs out of room and nothing is ever preempted.
    """

    def __init__(
        self,
        num_slots: int,
        max_model_len: int,
        max_num_batched_tokens: int,
    ) -> None:
        super().__init__(
            max_num_seqs=num_slots,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )
        self.num_slots = num_slots
        self._free_slots = list(range(num_slots))  # a heap

    def _check_fits(self, seq: Sequence) -> None:
        """Any prompt under max_model_len fits a slot; `Engine.add_request` has checked that."""

    def _try_allocate(self, seq: Sequence) -> bool:
        if not self._free_slots:
            return False
        seq.slot = heapq.heappop(self._free_slots)
        return True

    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[str]) -> bool:
        return True

    def _free(self, seq: Sequence) -> None:
        if seq.slot is None:
            raise RuntimeError(f"sequence {seq.seq_id!r} holds no slot (double free)")
        heapq.heappush(self._free_slots, seq.slot)
        seq.slot = None

    def _kv_usage(self) -> KVUsage:
        return KVUsage(
            num_blocks=self.num_slots,
            block_size=self.max_model_len,
            num_used_blocks=self.num_slots - len(self._free_slots),
            num_live_tokens=sum(seq.num_tokens for seq in self.running),
        )
