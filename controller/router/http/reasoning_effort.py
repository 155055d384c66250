"""What a request's reasoning effort asks of a thinking model: at most so many tokens of thinking
(GenerateRequest.reasoning_budget), after which the worker ends the thinking and the reply
follows. The same table serves chat completions' `reasoning_effort` and the Responses API's
`reasoning.effort`; Anthropic's `thinking.budget_tokens` is a budget already.

A model that does not think refuses every effort, naming the field (the worker's
INVALID_ARGUMENT on `reasoning_budget`), `max` included: it is sent as a budget too.
"""

from __future__ import annotations

from typing import Literal

from intentserve.v1 import inference_pb2

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
NO_LIMIT = 2**32 - 1  # `max`: a budget no reply reaches (thinking as long as the model does)
# Tokens of thinking each effort allows; `none` ends the thinking as soon as it opens.
EFFORT_BUDGETS: dict[str, int] = {
    "none": 0,
    "minimal": 128,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
    "xhigh": 32768,
    "max": NO_LIMIT,
}


def set_effort(request: inference_pb2.GenerateRequest, effort: Effort | None) -> None:
    """`effort`'s budget on `request`; None leaves the thinking as the model has it."""
    if effort is not None:
        request.reasoning_budget = EFFORT_BUDGETS[effort]
