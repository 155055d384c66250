"""What one scheduling step hands the model runner: the narrow result type of `schedule()`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One sequence's share of a step: compute `token_ids` at positions start_pos.. onwards.

    NOTE: exactly one of `block_table` (paged cache) and `slot` (contiguous cache) is set.
    """

    seq_id: str
    start_pos: int  # the sequence's num_computed_tokens before this step
    token_ids: tuple[int, ...]  # the num_new_tokens inputs: a prefill chunk or one decode token
    needs_logits: bool  # this step reaches its last token: sample one token from its logits
    block_table: tuple[int, ...] | None = None
    slot: int | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_context_tokens(self) -> int:
        """Tokens whose KV the attention sees after this step: start_pos + num_new_tokens."""
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledSeq, ...]  # running sequences (oldest first), then admissions
    preempted_seq_ids: tuple[str, ...]  # sent back to waiting this step; KV freed
    # (source, destination) block ids whose KV rows are copied before the forward (fork).
    block_copies: tuple[tuple[int, int], ...] = ()

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(item.token_ids) for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
