"""One step's attention inputs in the form every backend starts from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from intentserve.worker.sched.scheduler_output import ScheduledSeq


@dataclass(frozen=True)
class StepBatch:
    """The scheduled sequences of one step, as tensors on the cache's device.

    Rows of the flattened token batch are grouped by sequence in scheduling order:
    sequence i owns rows query_start[i] : query_start[i + 1].
    """

    tables: torch.Tensor  # [B, max_blocks] int64 block table per sequence, padded with 0
    context_lens: list[int]  # per sequence: tokens in the cache after this step
    query_lens: list[int]  # per sequence: new tokens this step (1 for a decode)
    query_start: list[int]  # [B + 1] row offsets
    slot_mapping: torch.Tensor  # [T] int64 flat cache row of each new token
    positions: torch.Tensor  # [T] int64 position of each new token in its sequence
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


def build_step_batch(
    scheduled: Sequence[ScheduledSeq], block_size: int, device: torch.device
) -> StepBatch:
    """NOTE: a contiguous-cache sequence is addressed as a one-block table `(slot,)` whose block
    is max_model_len tokens long, so both cache kinds share one addressing scheme."""
    tables_py = [
        item.block_table if item.block_table is not None else (item.slot,) for item in scheduled
    ]
    width = max(len(t) for t in tables_py)
    tables = torch.tensor([list(t) + [0] * (width - len(t)) for t in tables_py], dtype=torch.int64)
    query_lens = [item.num_new_tokens for item in scheduled]
    context_lens = [item.num_context_tokens for item in scheduled]
    query_start = [0]
    for n in query_lens:
        query_start.append(query_start[-1] + n)
    # Positions of the new tokens and their flat rows through each sequence's table.
    # NOTE: plain Python, then one tensor each: a decode row is a few integer operations, and
    # the per-sequence torch ops this replaces (an arange each, repeat_interleave, a gather)
    # cost ~10x more at 32-64 sequences.
    positions, slots = [], []
    for item, table in zip(scheduled, tables_py, strict=True):
        for pos in range(item.start_pos, item.num_context_tokens):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    return StepBatch(
        tables=tables.to(device),
        context_lens=context_lens,
        query_lens=query_lens,
        query_start=query_start,
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        block_size=block_size,
    )
