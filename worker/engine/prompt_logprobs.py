"""The log-probability of each prompt token given the tokens before it (what evaluation harnesses
score a text by), computed from the hidden states of the prompt's own prefill rows.

Position p's logits predict the token at p + 1, so a prefill chunk at positions s..e-1 scores the
prompt tokens s+1..e (those that are prompt tokens); the first prompt token has no score. A
sequence that asks for these computes its prompt whole (`Sequence.reuses_prefix_cache` False).
"""

from __future__ import annotations

import torch
from intentserve.worker.engine.sampler import TokenLogprobs
from intentserve.worker.sched.sequence import Sequence
from torch import Tensor


def wants_prompt_logprobs(seq: Sequence, start_pos: int) -> bool:
    """Whether a step of `seq` from `start_pos` holds rows that score prompt tokens."""
    return seq.params.prompt_logprobs is not None and start_pos < seq.num_prompt_tokens - 1


def score_prompt(model, hidden: Tensor, seq: Sequence, start_pos: int) -> dict[int, TokenLogprobs]:
    """hidden: [n, hidden] for positions start_pos.. -> {prompt position: its token's score}."""
    num_rows = min(hidden.shape[0], seq.num_prompt_tokens - 1 - start_pos)
    targets = seq.prompt_token_ids[start_pos + 1 : start_pos + 1 + num_rows]
    log_probs = torch.log_softmax(model.compute_logits(hidden[:num_rows]).float(), dim=-1)
    index = torch.tensor(targets, device=log_probs.device)[:, None]
    chosen = log_probs.gather(1, index)[:, 0].tolist()
    k = seq.params.prompt_logprobs
    top_values, top_ids = log_probs.topk(k, dim=-1) if k else (None, None)
    scores = {}
    for j, (token_id, logprob) in enumerate(zip(targets, chosen, strict=True)):
        top = ()
        if k:
            top = tuple(zip(top_ids[j].tolist(), top_values[j].tolist(), strict=True))
        scores[start_pos + 1 + j] = TokenLogprobs(token_id, logprob, top)
    return scores
