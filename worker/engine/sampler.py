"""Next-token choice for a batch of rows: greedy rows by argmax, the rest by temperature, top-k,
top-p and an optional per-request seed (a request's draws do not depend on its batch mates).

A row that cannot be sampled is that request's failure alone: it comes back as a value in
`StepSamples.failures` (logits that are not finite, an error while sampling), and every other
row is sampled as if it were not there.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from intentserve.worker.attention.cpu_kernels import KernelUnavailable, fused_ops
from intentserve.worker.engine.sampling import SamplingParams
from torch import Tensor

log = logging.getLogger(__name__)


@functools.cache
def _compiled_max_argmax():
    """fused_ops.c's row-wise (maximum, argmax), or None where the library cannot be built."""
    try:
        return fused_ops().max_argmax_rows_f32
    except KernelUnavailable as exc:
        log.info("the sampler's argmax stays in torch ops: %s", exc.reason)
        return None


@dataclass(frozen=True)
class StepSamples:
    """One step's sampling: a token for each row that could be sampled, and for each that could
    not, why (a sentence that names the stage)."""

    tokens: dict[str, int]
    failures: dict[str, str]


def argmax_rows(logits: Tensor, chunk: int = 1024) -> Tensor:
    """Row-wise argmax of [N, vocab], exactly as `logits.argmax(-1)` (ties and NaN go to the
    lowest index)."""
    return max_and_argmax_rows(logits, chunk)[1]


def max_and_argmax_rows(
    logits: Tensor, chunk: int = 1024, *, compiled: bool = True
) -> tuple[Tensor, Tensor]:
    """Row-wise (maximum, argmax) of [N, vocab], exactly as `logits.amax(-1)` (NaN where a row
    holds one) and `logits.argmax(-1)` (ties and NaN go to the lowest index), from one read of
    the logits. On the CPU in float32: fused_ops.c's `max_argmax_rows_f32` (`compiled=False`
    leaves it out, for comparisons); else torch ops: the maximum of each chunk of `chunk`
    columns, then the argmax inside the first chunk holding the row's maximum.

    NOTE: on this 2-core CPU, torch's argmax over [32, 49152] float32 took 1.1 ms per step;
    `amax` vectorizes and the two passes take 0.12 ms. The sampler's check for non-finite rows
    reads the row maxima from here, not from a pass of its own over the logits.
    """
    num_rows, vocab = logits.shape
    on_cpu = logits.device.type == "cpu" and logits.is_contiguous()
    if compiled and on_cpu and logits.dtype == torch.float32 and 16 <= vocab < 2**31:
        kernel = _compiled_max_argmax()
        if kernel is not None:
            row_max = torch.empty(num_rows, dtype=torch.float32)
            index = torch.empty(num_rows, dtype=torch.int64)
            kernel(logits.data_ptr(), num_rows, vocab, row_max.data_ptr(), index.data_ptr())
            return row_max, index
    if not on_cpu or vocab < 4 * chunk:
        return logits.amax(dim=-1), logits.argmax(dim=-1)
    full = vocab // chunk * chunk
    head = logits[:, :full].view(num_rows, full // chunk, chunk)
    maxima = head.amax(dim=-1)  # [N, chunks]; NaN where a chunk holds one
    best = maxima.argmax(dim=-1)  # the first chunk with the maximum (or the first NaN)
    index = best * chunk + head[torch.arange(num_rows), best].argmax(dim=-1)
    row_max = maxima.gather(1, best[:, None])[:, 0]
    if full < vocab:
        tail_max, tail_index = logits[:, full:].max(dim=-1)
        tail_wins = (tail_max > row_max) | (tail_max.isnan() & ~row_max.isnan())
        index = torch.where(tail_wins, tail_index + full, index)
        row_max = torch.where(tail_wins, tail_max, row_max)
    return row_max, index


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
    ) -> StepSamples:
        """logits: [N, vocab] float32 on any device -> a token per row, or why not."""
        # NOTE: amax propagates NaN, so a row maximum that is not finite flags NaN, +inf, or a
        # row with no finite value; -inf entries alone are tokens that are never drawn.
        # NOTE: isfinite in Python, on the N maxima as floats: the step's first torch op after the
        # LM head's kernel (56 MB of weights streamed through the caches) took 40-100 us there.
        row_max, chosen = max_and_argmax_rows(logits)
        finite = [math.isfinite(m) for m in row_max.tolist()]
        chosen = chosen.tolist()  # [N]
        tokens: dict[str, int] = {}
        failures: dict[str, str] = {}
        for row, (seq_id, p) in enumerate(zip(seq_ids, params, strict=True)):
            if not finite[row]:
                failures[seq_id] = "logits: the model's logits for this request are not finite"
            elif p.greedy:
                tokens[seq_id] = chosen[row]
            else:
                try:
                    tokens[seq_id] = self._sample_row(logits[row], p, self._generator(seq_id, p))
                except Exception as error:  # NOTE: this request's failure, not its batch's
                    log.exception("sampling failed for request %s", seq_id)
                    failures[seq_id] = f"sampling: {type(error).__name__}: {error}"
        return StepSamples(tokens, failures)

    @staticmethod
    def _sample_row(logits: Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        """One draw from finite logits [vocab], in float64 (which holds every float32 exactly).

        The logits are shifted so that the best is 0 before dividing by the temperature: every
        scaled value is <= 0 and none overflows, whatever the (finite, positive) temperature.
        A temperature so small that every other token's exp() underflows draws among the best
        tokens only, i.e. it is greedy.
        """
        values = logits.detach().to("cpu", torch.float64)  # [vocab]
        scaled = (values - values.max()) / p.temperature
        if p.top_k:
            # On the unscaled values: scaling may round distinct logits to one value.
            kth = torch.topk(values, min(p.top_k, values.numel())).values[-1]
            scaled = scaled.masked_fill(values < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)  # the best token has exp(0) = 1: the sum is >= 1
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=gen))
