"""The input ranges a w8a8 worker smooths its projections with, measured on a fixed text.

`input_ranges` runs the model once, dequantized, over `CALIBRATION_TEXT` (at most
`CALIBRATION_TOKENS` tokens and no more than the model's positions; one sequence, no cache) and
records, for every projection and the LM head, the largest |x| each input channel saw.
quant_linear.smoothing_factors turns them into the per-channel factors that even the
activations out before they are quantized to int8.

The text is fixed and ships with the worker, so every replica of a deployment computes the same
factors and holds the same weights; it is not the text bench/weights.py measures perplexity on.
It mixes prose, a dialogue, a list and code, so the ranges cover more than one kind of input.
"""

from __future__ import annotations

import torch
from intentserve.worker.model.reference_attention import CausalAttention
from torch import Tensor, nn

CALIBRATION_TOKENS = 512  # below every supported model's sliding window: full causal is exact

CALIBRATION_TEXT = """\
An operator writes down what a deployment must be: which model it serves, how many replicas run
it, how much memory each one may give to its key-value cache, and whether paged attention is
required, preferred or forbidden. The controller reads that intent, asks every worker what it can
do, and decides. A worker that cannot meet a requirement is rejected with a reason, and the
deployment does not claim to be ready while any worker disagrees with what was asked.

User: How many requests can one replica hold at once?
Assistant: It depends on the cache. Each request needs blocks for its prompt and for the tokens
it will generate; the scheduler admits a request only when its blocks fit, and it tells you the
limit it computed when the worker starts.
User: And when the cache is full?
Assistant: New requests wait in the queue, or go to another replica with room. Nothing is
dropped silently: a request that can never fit is refused with the field that makes it too big.

Things to check before going to production:
1. Every bind address is loopback unless you mean otherwise.
2. The admin token file is readable by its owner only.
3. The workers' certificates come from this deployment's own authority.
4. The memory budget leaves room for the weights, the activations and the runtime.

def tokens_per_second(num_tokens: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return num_tokens / seconds

for replica in sorted(replicas, key=lambda r: r.index):
    print(f"{replica.name}: {replica.state} ({replica.num_blocks} blocks, {replica.dtype})")

Numbers matter here: 32 streams at 128 tokens each is 4,096 tokens; at 1,200 tokens a second
that takes about 3.4 seconds. The weights of a 135-million-parameter model take 270 MB in
bfloat16, about 135 MB in int8 and half of that in int4, and the smaller the weights, the less
memory each decode step has to read. Prices, dates and names change; the arithmetic does not.
"""


class _Recorder(nn.Module):
    """Stands in for one projection during the calibration pass and keeps its inputs' ranges."""

    def __init__(self, inner: nn.Module, key: str, ranges: dict[str, Tensor]) -> None:
        super().__init__()
        self.inner, self.key, self.ranges = inner, key, ranges

    def forward(self, x: Tensor) -> Tensor:
        seen = x.detach().float().abs().reshape(-1, x.shape[-1]).amax(dim=0)
        known = self.ranges.get(self.key)
        self.ranges[self.key] = seen if known is None else torch.maximum(known, seen)
        return self.inner.forward(x)


@torch.inference_mode()
def input_ranges(
    model: nn.Module, token_ids: list[int], owners: list[tuple[nn.Module, str, str]]
) -> dict[str, Tensor]:
    """key -> max |x| per input channel, for each (owner, attribute, key) in `owners` and for
    "lm_head" (the final hidden states the head reads)."""
    limit = min(CALIBRATION_TOKENS, model.config.max_position_embeddings)
    ids = torch.tensor(token_ids[:limit], dtype=torch.long)
    if len(ids) < 2:
        raise ValueError("the calibration text must be at least 2 tokens long")
    ranges: dict[str, Tensor] = {}
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in owners]
    try:
        for (owner, name, key), (_, _, inner) in zip(owners, originals, strict=True):
            setattr(owner, name, _Recorder(inner, key, ranges))
        device = model.embed_tokens.weight.device
        hidden = model(
            ids.to(device), torch.arange(len(ids), device=device), CausalAttention(), None
        )
    finally:
        for owner, name, inner in originals:
            setattr(owner, name, inner)
    ranges["lm_head"] = hidden.detach().float().abs().amax(dim=0)
    return {key: value.cpu() for key, value in ranges.items()}
