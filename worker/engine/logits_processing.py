"""What a request asks to change in the model's logits before a token is drawn: logit_bias,
min_tokens (its stop tokens banned) and the presence, frequency and repetition penalties.

Batched: one index_put per kind of change over every row that asks for it, and the penalties as
whole-row tensor ops over the rows that use them; only the gathering of each row's token ids is
Python. Rows that ask for none of these are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from intentserve.worker.engine.sampling import SamplingParams
from torch import Tensor


class TokenHistory(Protocol):
    """A request's tokens so far (the scheduler's Sequence is one)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]


def process_logits(
    logits: Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[TokenHistory],
    eos_token_ids: Sequence[int],
) -> None:
    """Apply each row's changes to logits [N, vocab] in place (rows asking for none are left)."""
    _add_logit_bias(logits, params)
    _ban_early_stops(logits, params, histories, eos_token_ids)
    _penalize(logits, params, histories)


def _put(logits: Tensor, rows: list[int], cols: list[int], values, accumulate: bool) -> None:
    if rows:
        index = (
            torch.tensor(rows, device=logits.device),
            torch.tensor(cols, device=logits.device),
        )
        logits.index_put_(index, torch.as_tensor(values, dtype=logits.dtype), accumulate)


def _add_logit_bias(logits: Tensor, params: Sequence[SamplingParams]) -> None:
    rows, cols, biases = [], [], []
    for row, p in enumerate(params):
        for token_id, bias in p.logit_bias:
            rows.append(row)
            cols.append(token_id)
            biases.append(bias)
    _put(logits, rows, cols, biases, accumulate=True)


def _ban_early_stops(logits, params, histories, eos_token_ids) -> None:
    """Below min_tokens, no token that would end the request can be drawn (stop strings can
    still end it: they are text, found after the draw)."""
    rows, cols = [], []
    for row, (p, history) in enumerate(zip(params, histories, strict=True)):
        if len(history.output_token_ids) < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            rows += [row] * len(banned)
            cols += sorted(banned)
    _put(logits, rows, cols, float("-inf"), accumulate=False)


def _penalize(logits: Tensor, params, histories) -> None:
    """OpenAI's presence and frequency penalties over the output's tokens; the repetition
    penalty (as in CTRL and vLLM) over the prompt's and the output's."""
    rows = [row for row, p in enumerate(params) if p.penalized]
    if not rows:
        return
    num_rows, vocab = len(rows), logits.shape[1]
    out_rows, out_cols, seen_rows, seen_cols = [], [], [], []
    for i, row in enumerate(rows):
        output = histories[row].output_token_ids
        out_rows += [i] * len(output)
        out_cols += output
        if params[row].repetition_penalty != 1.0:
            prompt = histories[row].prompt_token_ids
            seen_rows += [i] * len(prompt)
            seen_cols += prompt
    counts = torch.zeros(num_rows, vocab, dtype=logits.dtype, device=logits.device)
    _put(counts, out_rows, out_cols, 1.0, accumulate=True)  # [R, vocab] occurrences in the output
    seen = counts > 0
    seen_prompt = torch.zeros_like(seen)
    _put(seen_prompt, seen_rows, seen_cols, True, accumulate=False)
    seen |= seen_prompt

    def column(name: str) -> Tensor:
        values = [getattr(params[row], name) for row in rows]
        return torch.tensor(values, dtype=logits.dtype, device=logits.device)[:, None]

    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)  # [R, vocab]
    penalty = column("repetition_penalty")
    repeated = torch.where(sub > 0, sub / penalty, sub * penalty)
    sub = torch.where(seen, repeated, sub)
    sub -= column("frequency_penalty") * counts + column("presence_penalty") * (counts > 0)
    logits.index_copy_(0, index, sub)
