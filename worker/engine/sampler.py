"""Next-token choice for a batch of rows: greedy rows by argmax, the rest by temperature, top-k,
top-p and an optional per-request seed (a request's draws do not depend on its batch mates)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from intentserve.worker.engine.sampling import SamplingParams
from torch import Tensor


def argmax_rows(logits: Tensor, chunk: int = 1024) -> Tensor:
    """Row-wise argmax of [N, vocab], exactly as `logits.argmax(-1)` (ties and NaN go to the
    lowest index), in two passes: the maximum of each chunk of `chunk` columns, then the argmax
    inside the first chunk holding the row's maximum.

    NOTE: on this 2-core CPU, torch's argmax over [32, 49152] float32 took 1.1 ms per step;
    `amax` vectorizes and the two passes take 0.12 ms.
    """
    num_rows, vocab = logits.shape
    if logits.device.type != "cpu" or vocab < 4 * chunk or not logits.is_contiguous():
        return logits.argmax(dim=-1)
    full = vocab // chunk * chunk
    head = logits[:, :full].view(num_rows, full // chunk, chunk)
    maxima = head.amax(dim=-1)  # [N, chunks]; NaN where a chunk holds one
    best = maxima.argmax(dim=-1)  # the first chunk with the maximum (or the first NaN)
    index = best * chunk + head[torch.arange(num_rows), best].argmax(dim=-1)
    if full < vocab:
        tail_max, tail_index = logits[:, full:].max(dim=-1)
        head_max = maxima.gather(1, best[:, None])[:, 0]
        tail_wins = (tail_max > head_max) | (tail_max.isnan() & ~head_max.isnan())
        index = torch.where(tail_wins, tail_index + full, index)
    return index


class Sampler:
    def __init__(self) -> None:
        # One generator per seeded request, advanced only by that request's own draws.
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, seq_id: str) -> None:
        self._generators.pop(seq_id, None)

    def _generator(self, seq_id: str, params: SamplingParams) -> torch.Generator | None:
        if params.seed is None:
            return None
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = self._generators[seq_id] = torch.Generator().manual_seed(params.seed)
        return gen

    def sample(
        self, logits: Tensor, seq_ids: Sequence[str], params: Sequence[SamplingParams]
    ) -> list[int]:
        """logits: [N, vocab] float32 on any device -> one token id per row."""
        chosen = argmax_rows(logits).tolist()
        for row, (seq_id, p) in enumerate(zip(seq_ids, params, strict=True)):
            if not p.greedy:
                chosen[row] = self._sample_row(
                    logits[row].float().cpu(), p, self._generator(seq_id, p)
                )
        return chosen

    @staticmethod
    def _sample_row(logits: Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        logits = logits / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=gen))
