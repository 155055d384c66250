"""Request ids: the one place they are made and checked, so a request reads the same in the
controller's and the worker's logs (the controller names a request before routing it; the
engine names one that arrives without a name), and both sides accept the same ids.

An id is echoed in every response chunk and in log lines, so it is short and printable.
"""

from __future__ import annotations

import uuid

MAX_REQUEST_ID_CHARS = 256


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def request_id_problem(request_id: str) -> str | None:
    """Why `request_id` cannot name a request (a sentence that does not repeat it), or None.
    An empty id is no problem: it means "unset", and the receiver names the request."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"has {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS}"
    if not request_id.isprintable():
        return "must be printable text (no control characters or line breaks)"
    return None


def check_request_id(request_id: str) -> str:
    """`request_id` unchanged, or ValueError `request_id: why` (INVALID_ARGUMENT on both sides)."""
    problem = request_id_problem(request_id)
    if problem is not None:
        raise ValueError(f"request_id: {problem}")
    return request_id
