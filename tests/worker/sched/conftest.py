"""Helpers that play the engine around a scheduler: a fake model that samples known tokens."""

from __future__ import annotations

import pytest
from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.sched.default_scheduler import DefaultScheduler
from intentserve.worker.sched.paged_scheduler import PagedScheduler
from intentserve.worker.sched.scheduler import Scheduler
from intentserve.worker.sched.scheduler_output import SchedulerOutput
from intentserve.worker.sched.sequence import Sequence


def fake_token(seq_id: str, position: int) -> int:
    """The token the fake model samples after `position` tokens: the same after recompute."""
    return (sum(map(ord, seq_id)) * 31 + position) % 1000


def run_step(scheduler: Scheduler) -> tuple[SchedulerOutput, list[Sequence]]:
    output = scheduler.schedule()
    sampled = {
        item.seq_id: fake_token(item.seq_id, item.num_context_tokens)
        for item in output.scheduled
        if item.needs_logits
    }
    return output, scheduler.postprocess(output, sampled)


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.num_unfinished:
        assert len(outputs) < max_steps, "the scheduler stopped making progress"
        outputs.append(run_step(scheduler)[0])
    return outputs


def make_seq(seq_id: str, num_prompt_tokens: int, max_tokens: int = 4, first: int = 0) -> Sequence:
    return Sequence(seq_id, list(range(first, first + num_prompt_tokens)), max_tokens=max_tokens)


def make_paged(
    num_blocks: int = 11,
    block_size: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    enable_prefix_caching: bool = True,
) -> PagedScheduler:
    allocator = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
    return PagedScheduler(allocator, max_num_seqs, max_num_batched_tokens, max_model_len)


def make_default(
    num_slots: int = 4, max_model_len: int = 256, max_num_batched_tokens: int = 64
) -> DefaultScheduler:
    return DefaultScheduler(num_slots, max_model_len, max_num_batched_tokens)


@pytest.fixture(params=["paged", "default"])
def make_scheduler(request):
    """Builds either scheduler from the keywords both accept (max_num_seqs = num_slots)."""

    def build(max_num_seqs: int = 4, **kwargs) -> Scheduler:
        if request.param == "paged":
            return make_paged(max_num_seqs=max_num_seqs, **kwargs)
        return make_default(num_slots=max_num_seqs, **kwargs)

    return build


# The helpers as fixtures: test modules never import conftest.


@pytest.fixture(scope="session")
def sampled_token():
    return fake_token


@pytest.fixture(scope="session")
def step():
    return run_step


@pytest.fixture(scope="session")
def drain():
    return run_to_completion


@pytest.fixture(scope="session")
def new_seq():
    return make_seq


@pytest.fixture(scope="session")
def paged():
    return make_paged


@pytest.fixture(scope="session")
def default():
    return make_default
