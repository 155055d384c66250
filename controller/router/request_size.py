"""How big a request a worker's multiplexed call carries: one over MAX_REQUEST_BYTES is refused
before it is routed, naming its largest field (on that call a message over the worker's receive
limit would end every request on it).
"""

from __future__ import annotations

from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.controller.errors import RequestTooLarge
from intentserve.v1 import inference_pb2


def check_size(request: inference_pb2.GenerateRequest) -> None:
    """RequestTooLarge, naming the request's largest field, when it is over MAX_REQUEST_BYTES:
    on a worker's multiplexed call a message over its receive limit would end the call, and
    every other request on it with it."""
    size = request.ByteSize()
    if size > MAX_REQUEST_BYTES:
        raise RequestTooLarge(
            _largest_field(request),
            f"the request is {size} bytes; allowed: at most {MAX_REQUEST_BYTES} bytes in all "
            "(prompt, messages, stop strings and the rest)",
        )


def _largest_field(message, prefix: str = "") -> str:
    """The dotted name of the set field that takes the most bytes (into singular messages)."""
    sizes = []
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        if field.message_type is not None:
            size = sum(v.ByteSize() for v in values)
        else:  # text by its length (no copy of a 50 MB prompt to rank it); a number up to 10
            size = sum(len(v) if isinstance(v, str | bytes) else 10 for v in values)
        inner = value if field.message_type is not None and not field.is_repeated else None
        sizes.append((size, field, inner))
    _, field, inner = max(sizes, key=lambda s: s[0])
    name = prefix + field.name
    return _largest_field(inner, name + ".") if inner is not None and inner.ListFields() else name
