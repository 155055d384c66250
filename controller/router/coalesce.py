"""A stream's chunks that wait together leave as one: when a client reads slower than its worker
sends, the router's next message to it carries every token that has arrived since its last one,
instead of a message per engine step that each wait their turn.

    response = items.popleft()
    while items and joins(response, items[0]):
        append(response, items.popleft())

NOTE: a message to a client costs a router about what a whole token costs it (gRPC's write, one
TLS record and one loopback send each: docs/scale.md, run 8), so a router that falls behind would
otherwise stay behind: its queue grows by the tokens it cannot write. Merged, a stream behind by
k steps costs one write for its k chunks, and the router's cost per token falls as its load rises.
A client that keeps up gets every chunk as the worker sent it (nothing waits to be merged).
Chunks of different choices (`index`) are never merged, and nothing is merged past a choice's last
chunk (the one with its finish reason).
"""

from __future__ import annotations

from intentserve.v1 import inference_pb2

Response = inference_pb2.GenerateResponse

# How each GenerateResponse field reads when two chunks are merged: appended (the later's items
# after the earlier's), concatenated (text), the same in both, or the later's (what the last
# chunk says: its counts, its finish reason). A field missing here fails a test: a new field must
# be given its rule.
APPENDED = ("token_ids", "logprobs", "prompt_logprobs", "tool_calls")
CONCATENATED = ("text", "reasoning")
SAME = ("request_id", "worker_id", "index")
LATEST = (
    "finish_reason",
    "num_prompt_tokens",
    "num_output_tokens",
    "stop_string",
    "num_reasoning_tokens",
)


def joins(response: Response, waiting: object) -> bool:
    """Whether `waiting` (the stream's next item) may be merged into `response`: a chunk of the
    same choice, and `response` not that choice's last."""
    return (
        type(waiting) is Response and not response.finish_reason and waiting.index == response.index
    )


def append(response: Response, later: Response) -> None:
    """Merge `later` (the same choice's next chunk) into `response`, in place."""
    text, reasoning = response.text + later.text, response.reasoning + later.reasoning
    # NOTE: MergeFrom appends the repeated fields and takes `later`'s scalars where set (proto3:
    # non-zero), which is LATEST; SAME fields are equal or unset in one of the two.
    response.MergeFrom(later)
    response.text, response.reasoning = text, reasoning
