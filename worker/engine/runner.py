"""Runs one scheduled step through the model: inputs -> forward -> logits -> sampled tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch
from intentserve.worker.attention.batch import build_step_batch
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.prompt_logprobs import score_prompt, wants_prompt_logprobs
from intentserve.worker.engine.sampler import Sampler, StepSamples
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.sched.scheduler_output import SchedulerOutput
from intentserve.worker.sched.sequence import Sequence


class Runner(Protocol):
    """What the engine needs from a runner: one step in, sampled tokens out."""

    model: LlamaModel

    def run(self, output: SchedulerOutput, seq_of: Callable[[str], Sequence]) -> StepSamples: ...

    def forget(self, seq_id: str) -> None: ...


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        attention,
        block_size: int,
        device: torch.device,
        eos_token_ids: tuple[int, ...] = (),
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.model = model
        self.attention = attention  # a paged backend (attention/) over the KV pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler(eos_token_ids, grammars)
        self.graphs = None  # DecodeGraphs, set where decode steps replay CUDA graphs

    @torch.inference_mode()
    def run(self, output: SchedulerOutput, seq_of: Callable[[str], Sequence]) -> StepSamples:
        """A sampled token (or why not) for each sequence whose step reaches its end.

        An exception here is the step's own failure (the forward); a request's is a value."""
        scheduled = output.scheduled
        self.attention.pool.copy_blocks(output.block_copies)  # before the forward writes any
        batch = build_step_batch(scheduled, self.block_size, self.device)
        input_ids = torch.tensor(
            [t for item in scheduled for t in item.token_ids], dtype=torch.int64, device=self.device
        )
        hidden = self.graphs.run(batch, input_ids) if self.graphs is not None else None
        if hidden is None:
            meta = self.attention.prepare(batch)
            hidden = self.model(input_ids, batch.positions, self.attention, meta)  # [T, hidden]
        scores = {}
        for i, item in enumerate(scheduled):
            seq = seq_of(item.seq_id)
            if wants_prompt_logprobs(seq, item.start_pos):
                rows = hidden[batch.query_start[i] : batch.query_start[i + 1]]
                scores[item.seq_id] = score_prompt(self.model, rows, seq, item.start_pos)
        wanted = [i for i, item in enumerate(scheduled) if item.needs_logits]
        if not wanted:
            return StepSamples({}, {}, prompt_logprobs=scores)
        last_rows = torch.tensor([batch.query_start[i + 1] - 1 for i in wanted], device=self.device)
        logits = self.model.compute_logits(hidden[last_rows])  # [N, vocab] float32
        seq_ids = [scheduled[i].seq_id for i in wanted]
        seqs = [seq_of(s) for s in seq_ids]
        samples = self.sampler.sample(logits, seq_ids, [s.params for s in seqs], seqs)
        return dataclasses.replace(samples, prompt_logprobs=scores) if scores else samples

    def forget(self, seq_id: str) -> None:
        self.sampler.forget(seq_id)
