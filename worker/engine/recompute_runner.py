"""The runner of the `no_kv_cache` debug mode: no KV cache at all.

Every step recomputes each sampled sequence's whole context with cache-free causal attention,
one sequence at a time: O(n^2) work per sequence, meant for isolating cache bugs, not serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.prompt_logprobs import score_prompt, wants_prompt_logprobs
from intentserve.worker.engine.sampler import Sampler, StepSamples
from intentserve.worker.model.llama import LlamaModel
from intentserve.worker.model.reference_attention import CausalAttention
from intentserve.worker.sched.scheduler_output import SchedulerOutput
from intentserve.worker.sched.sequence import Sequence


class RecomputeRunner:
    def __init__(
        self,
        model: LlamaModel,
        device: torch.device,
        eos_token_ids: tuple[int, ...] = (),
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.sampler = Sampler(eos_token_ids, grammars)
        self.attention = CausalAttention(model.config.layer_windows)
        # Token ids each sequence has been fed so far: the only per-sequence state kept.
        self._history: dict[str, list[int]] = {}

    @torch.inference_mode()
    def run(self, output: SchedulerOutput, seq_of: Callable[[str], Sequence]) -> StepSamples:
        seq_ids, last_logits, scores = [], [], {}
        for item in output.scheduled:
            # NOTE: start_pos drops back to 0 after a preemption; slicing keeps history exact.
            history = self._history.get(item.seq_id, [])[: item.start_pos] + list(item.token_ids)
            self._history[item.seq_id] = history
            if not item.needs_logits:
                continue
            ids = torch.tensor(history, dtype=torch.int64, device=self.device)
            positions = torch.arange(len(history), device=self.device)
            hidden = self.model(ids, positions, self.attention, None)  # [n, hidden]
            seq = seq_of(item.seq_id)
            if not seq.output_token_ids and wants_prompt_logprobs(seq, 0):  # its first step
                scores[item.seq_id] = score_prompt(self.model, hidden, seq, 0)
            last_logits.append(self.model.compute_logits(hidden[-1:]))
            seq_ids.append(item.seq_id)
        if not seq_ids:
            return StepSamples({}, {}, prompt_logprobs=scores)
        seqs = [seq_of(s) for s in seq_ids]
        samples = self.sampler.sample(
            torch.cat(last_logits), seq_ids, [s.params for s in seqs], seqs
        )
        return dataclasses.replace(samples, prompt_logprobs=scores) if scores else samples

    def forget(self, seq_id: str) -> None:
        self._history.pop(seq_id, None)
        self.sampler.forget(seq_id)
