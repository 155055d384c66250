"""The worker's exception -> gRPC status table, for the shared interceptor
(intentserve.common.status)."""

from __future__ import annotations

import grpc
from intentserve.policy import IntentError, PolicyError
from intentserve.worker.engine.encoder_engine import WrongTaskError
from intentserve.worker.service.request_stream import EngineLoopClosedError, RequestFailedError
from intentserve.worker.service.servicer import WorkerOverloadedError

# First match wins: IntentError is a PolicyError and a ValueError, and means bad input.
# InvalidRequestError is a ValueError.
STATUS_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (IntentError, grpc.StatusCode.INVALID_ARGUMENT),
    (PolicyError, grpc.StatusCode.FAILED_PRECONDITION),
    (WrongTaskError, grpc.StatusCode.FAILED_PRECONDITION),  # its message names the task
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (WorkerOverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineLoopClosedError, grpc.StatusCode.UNAVAILABLE),
    (RequestFailedError, grpc.StatusCode.INTERNAL),  # its message names the cause
)
