"""Runs one scheduled step through the model: inputs -> forward -> logits -> sampled tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from intentserve.worker.attention.batch import build_step_batch
from intentserve.worker.engine.sampler import Sampler, StepSamples
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.sched.scheduler_output import SchedulerOutput


class Runner(Protocol):
    """What the engine needs from a runner: one step in, sampled tokens out."""

    model: LlamaModel

    def run(
        self, output: SchedulerOutput, params_of: Callable[[str], SamplingParams]
    ) -> StepSamples: ...

    def forget(self, seq_id: str) -> None: ...


class ModelRunner:
    def __init__(self, model: LlamaModel, attention, block_size: int, device: torch.device) -> None:
        self.model = model
        self.attention = attention  # a paged backend (attention/) over the KV pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.graphs = None  # DecodeGraphs, set where decode steps replay CUDA graphs

    @torch.inference_mode()
    def run(
        self, output: SchedulerOutput, params_of: Callable[[str], SamplingParams]
    ) -> StepSamples:
        """A sampled token (or why not) for each sequence whose step reaches its end.

        An exception here is the step's own failure (the forward); a request's is a value."""
        scheduled = output.scheduled
        batch = build_step_batch(scheduled, self.block_size, self.device)
        input_ids = torch.tensor(
            [t for item in scheduled for t in item.token_ids], dtype=torch.int64, device=self.device
        )
        hidden = self.graphs.run(batch, input_ids) if self.graphs is not None else None
        if hidden is None:
            meta = self.attention.prepare(batch)
            hidden = self.model(input_ids, batch.positions, self.attention, meta)  # [T, hidden]
        wanted = [i for i, item in enumerate(scheduled) if item.needs_logits]
        if not wanted:
            return StepSamples({}, {})
        last_rows = torch.tensor([batch.query_start[i + 1] - 1 for i in wanted], device=self.device)
        logits = self.model.compute_logits(hidden[last_rows])  # [N, vocab] float32
        seq_ids = [scheduled[i].seq_id for i in wanted]
        return self.sampler.sample(logits, seq_ids, [params_of(s) for s in seq_ids])

    def forget(self, seq_id: str) -> None:
        self.sampler.forget(seq_id)
