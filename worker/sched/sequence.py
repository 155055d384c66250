"""One request as the scheduler sees it: token ids, progress, status and its KV location."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

_arrivals = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet; holds no KV
    RUNNING = "running"  # admitted; holds KV (blocks or a slot)
    PREEMPTED = "preempted"  # back in the waiting queue, KV freed; recomputes all its tokens
    FINISHED = "finished"  # done; holds no KV


class FinishReason(enum.Enum):
    STOP = "stop"  # the engine's stop check matched (EOS, a stop token or string)
    LENGTH = "length"  # max_tokens, max_model_len or the KV pool's capacity reached
    ABORT = "abort"  # cancelled by the client or the engine
    ERROR = "error"  # a failure of this request alone (its sampling, stop checks, its logits)
    # The engine's, never the scheduler's: a request that stopped after calling tools.
    TOOL_CALLS = "tool_calls"


@dataclass(eq=False, slots=True)
class Sequence:
    """A request's tokens and progress.

    NOTE: `num_computed_tokens` counts the tokens whose KV is in the cache; the tokens from there
    to `num_tokens` are still to be computed. After preemption it is 0 again and the output
    tokens generated so far are recomputed together with the prompt.
    """

    seq_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    params: object = None  # sampling parameters, opaque to the scheduler
    # False: its prompt is computed whole, never taken from the prefix cache (its prompt's
    # logits are wanted).
    reuses_prefix_cache: bool = True
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hits at the latest admission
    block_table: list[int] = field(default_factory=list)  # paged cache: block ids, in order
    slot: int | None = None  # contiguous cache: the slot it owns while running
    num_preemptions: int = 0
    # n > 1: the sequence whose computed prompt this one will share (until it forks), and the
    # number of sequences that fork from this one.
    fork_of: Sequence | None = None
    num_forks: int = 0
    arrival_index: int = field(default_factory=lambda: next(_arrivals))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def fork(self, seq_id: str, params: object) -> Sequence:
        """A new sequence with this one's prompt, to share its prompt's KV once computed."""
        self.num_forks += 1
        return Sequence(
            seq_id,
            list(self.prompt_token_ids),
            self.max_tokens,
            params=params,
            reuses_prefix_cache=self.reuses_prefix_cache,
            fork_of=self,
        )

    def get_token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end) of prompt + output, without copying either whole."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]
