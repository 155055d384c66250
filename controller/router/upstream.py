"""What a worker's failed call becomes for the client (a routed stream's, or a Tokenize call's).
Before anything streamed, a full worker (RESOURCE_EXHAUSTED) or an unavailable one is
`TryAnother`: the router tries the next worker, and the client gets the failure only when none is
left. A lost worker, or one that became unavailable mid-stream, is `WorkerUnavailable`; the
engine's INVALID_ARGUMENT passes through word for word, with its field; anything else is an
`UpstreamError` naming the worker.
"""

from __future__ import annotations

import grpc
from intentserve.common.field_errors import violation_of
from intentserve.controller.errors import Overloaded, UpstreamError, WorkerUnavailable
from intentserve.policy import Reason, ReasonCode

NO_READY_WORKER = Reason(ReasonCode.WORKER_NOT_SERVING, "no READY worker to route to")


class TryAnother(Exception):
    """The chosen worker refused before streaming anything (queue full, unreachable)."""

    def __init__(self, failure: Exception) -> None:
        super().__init__(str(failure))
        self.failure = failure  # what the client gets when no other worker is left


def upstream_failure(
    worker_id: str, error: grpc.RpcError, started: bool, abort_reason: Reason | None
) -> Exception:
    """The exception a failed upstream call becomes for the client."""
    code, details = error.code(), error.details()
    where = "mid-stream" if started else "before streaming"
    if abort_reason is not None:
        return WorkerUnavailable(f"worker {worker_id} was lost {where}: {abort_reason.message}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and not started:
        return TryAnother(Overloaded(f"worker {worker_id}: {details}"))
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        failure = WorkerUnavailable(f"worker {worker_id} became unavailable {where}: {details}")
        return failure if started else TryAnother(failure)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        # The engine's check of the request, naming the field: relayed word for word, with its
        # BadRequest detail.
        return UpstreamError(code, details, violation_of(error))
    return UpstreamError(code, f"worker {worker_id}: {details}")
