"""The controller's exception -> gRPC status table for the shared intentserve.common.status
interceptor."""

from __future__ import annotations

import grpc
from intentserve.controller.errors import (
    NotReady,
    Overloaded,
    QueueTimeout,
    UnknownWorker,
    WorkerAlive,
    WorkerUnavailable,
    WrongState,
    WrongTask,
)
from intentserve.policy import IntentError, PolicyError

# First match wins: IntentError is a PolicyError and a ValueError, and means bad input.
# An UpstreamError carries the worker's own status and passes through unchanged.
STATUS_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (IntentError, grpc.StatusCode.INVALID_ARGUMENT),
    (PolicyError, grpc.StatusCode.FAILED_PRECONDITION),
    (WrongState, grpc.StatusCode.FAILED_PRECONDITION),
    (WrongTask, grpc.StatusCode.FAILED_PRECONDITION),
    (WorkerAlive, grpc.StatusCode.ALREADY_EXISTS),
    (UnknownWorker, grpc.StatusCode.NOT_FOUND),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotReady, grpc.StatusCode.UNAVAILABLE),
    (WorkerUnavailable, grpc.StatusCode.UNAVAILABLE),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
)
