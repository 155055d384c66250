"""What both schedulers share: queues, the step's token budget, postprocess and finishing.

The engine loop is the same for either scheduler:

    output = scheduler.schedule()
    sampled = runner.run(output)  # {seq_id: token_id} for the entries with needs_logits
    scheduler.abort(seq_id, FinishReason.ERROR)  # for each request that failed alone
    finished = scheduler.postprocess(output, sampled, stops)  # stops: the engine's verdicts

There are no prefill and decode phases: each running sequence advances its num_computed_tokens
by up to the remaining token budget (a prompt chunk, or the one token sampled last step).
A subclass says only how KV is held: how to admit, how to make room, how to free.

n > 1: a sequence that others fork from (`Sequence.fork`) computes its prompt less the last
token first; they wait until it has, then share that KV (where the cache can: the paged one),
and each computes the last prompt token itself, so that all sample their first token together.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping

from intentserve.worker.cache.kv_usage import KVUsage
from intentserve.worker.sched.scheduler_output import ScheduledSeq, SchedulerOutput
from intentserve.worker.sched.scheduler_stats import SchedulerStats
from intentserve.worker.sched.sequence import FinishReason, Sequence, SequenceStatus


def _arrival(seq: Sequence) -> int:
    return seq.arrival_index


class Scheduler(ABC):
    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        limits = {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len,
        }
        for name, value in limits.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        # A sequence finishes (LENGTH) once it holds this many tokens; a subclass may lower it.
        self.max_num_tokens = max_model_len
        self.waiting: deque[Sequence] = deque()  # FIFO; preempted sequences go to the front
        self.running: list[Sequence] = []  # NOTE: kept sorted by arrival, newest last
        self.num_preemptions = 0
        self._unfinished: dict[str, Sequence] = {}
        self._block_copies: list[tuple[int, int]] = []  # a subclass's, for the next output

    # -- the engine's surface --------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queues a new sequence; raises ValueError, with the numbers, if the cache can never
        hold it. NOTE: the request itself (a non-empty prompt under max_model_len, max_tokens of
        at least 1) was checked where it entered, in `Engine.add_request`."""
        if seq.seq_id in self._unfinished:
            raise ValueError(f"sequence id {seq.seq_id!r} is already queued or running")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed_tokens or seq.block_table:
            raise ValueError(f"sequence {seq.seq_id!r} is not new (status {seq.status.value})")
        self._check_fits(seq)
        self._unfinished[seq.seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Finishes the sequence (ABORT, or ERROR when the engine failed it) wherever it is and
        frees its KV; False if unknown."""
        seq = self._unfinished.get(seq_id)
        if seq is None:
            return False
        if seq.status is SequenceStatus.RUNNING:
            self._finish(seq, reason)
        else:
            self.waiting.remove(seq)
            self._mark_finished(seq, reason)
        return True

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[str] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new_tokens = self._num_new_tokens(seq, budget)
            if not self._make_room(seq, num_new_tokens, preempted):
                break  # it preempted itself, the newest and so the last running
            scheduled.append(self._scheduled(seq, num_new_tokens))
            budget -= num_new_tokens
            index += 1
        # NOTE: after a preemption, admitting would take back the KV that was just freed.
        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and self._try_allocate(self.waiting[0])
        ):
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = seq.num_cached_tokens
            bisect.insort(self.running, seq, key=_arrival)
            num_new_tokens = self._num_new_tokens(seq, budget)
            scheduled.append(self._scheduled(seq, num_new_tokens))
            budget -= num_new_tokens
        copies, self._block_copies = tuple(self._block_copies), []
        return SchedulerOutput(
            scheduled=tuple(scheduled), preempted_seq_ids=tuple(preempted), block_copies=copies
        )

    def postprocess(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        stops: Mapping[str, FinishReason] | None = None,
    ) -> list[Sequence]:
        """Advances the step's sequences, appends sampled tokens; returns those that finished:
        the ones in `stops` (the engine's verdict on the token just sampled: EOS, a stop id or
        string) and the ones that reached their length limit.

        Sequences aborted since `schedule()` are skipped.
        """
        stops = stops or {}
        finished: list[Sequence] = []
        for item in output.scheduled:
            seq = self._unfinished.get(item.seq_id)
            if seq is None or seq.status is not SequenceStatus.RUNNING:
                continue
            if seq.num_computed_tokens != item.start_pos:
                raise RuntimeError(
                    f"sequence {item.seq_id!r} has {seq.num_computed_tokens} computed tokens, "
                    f"the step scheduled it at {item.start_pos}: postprocess of a stale output"
                )
            seq.num_computed_tokens += item.num_new_tokens
            if not item.needs_logits:
                continue
            if item.seq_id not in sampled_token_ids:
                raise RuntimeError(f"no sampled token for sequence {item.seq_id!r}")
            token_id = sampled_token_ids[item.seq_id]
            seq.output_token_ids.append(token_id)
            reason = stops.get(seq.seq_id) or self._length_reached(seq)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    @property
    def num_unfinished(self) -> int:
        return len(self._unfinished)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_waiting=len(self.waiting),
            num_running=len(self.running),
            num_preemptions=self.num_preemptions,
            kv=self._kv_usage(),
        )

    # -- shared helpers --------------------------------------------------------------------

    def _num_new_tokens(self, seq: Sequence, budget: int) -> int:
        end = seq.num_tokens
        if seq.num_forks and seq.num_computed_tokens < seq.num_prompt_tokens - 1:
            end = seq.num_prompt_tokens - 1  # NOTE: its forks share what it computes up to here
        return min(end - seq.num_computed_tokens, budget)

    def _scheduled(self, seq: Sequence, num_new_tokens: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return ScheduledSeq(
            seq_id=seq.seq_id,
            start_pos=start,
            token_ids=tuple(seq.get_token_ids(start, start + num_new_tokens)),
            needs_logits=start + num_new_tokens == seq.num_tokens,
            block_table=tuple(seq.block_table) if seq.slot is None else None,
            slot=seq.slot,
        )

    def _length_reached(self, seq: Sequence) -> FinishReason | None:
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_num_tokens:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Finishes a running sequence and frees its KV."""
        self.running.remove(seq)
        self._free(seq)
        self._mark_finished(seq, reason)

    def _mark_finished(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self._unfinished[seq.seq_id]

    # -- how KV is held ----------------------------------------------------------------------

    @abstractmethod
    def _check_fits(self, seq: Sequence) -> None:
        """Raises ValueError, with the numbers, if the cache can never hold `seq`'s prompt."""

    @abstractmethod
    def _try_allocate(self, seq: Sequence) -> bool:
        """Gives a waiting `seq` KV for all its tokens and sets num_cached_tokens; or False."""

    @abstractmethod
    def _make_room(self, seq: Sequence, num_new_tokens: int, preempted: list[str]) -> bool:
        """Ensures a running `seq` can hold num_new_tokens more; False if it was preempted.

        May preempt newer running sequences, appending their ids to `preempted`.
        """

    @abstractmethod
    def _free(self, seq: Sequence) -> None:
        """Releases a running `seq`'s KV."""

    @abstractmethod
    def _kv_usage(self) -> KVUsage: ...
