"""The one place where the worker's exceptions become gRPC status codes (unary and streaming)."""

from __future__ import annotations

import logging

import grpc

from policy import IntentError, PolicyError
from worker.service.engine_loop import EngineLoopClosedError
from worker.service.servicer import WorkerOverloadedError

log = logging.getLogger(__name__)

# First match wins: IntentError is a PolicyError and a ValueError, and means bad input.
# InvalidRequestError is a ValueError.
STATUS_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (IntentError, grpc.StatusCode.INVALID_ARGUMENT),
    (PolicyError, grpc.StatusCode.FAILED_PRECONDITION),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (WorkerOverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineLoopClosedError, grpc.StatusCode.UNAVAILABLE),
)


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message a client sees for `error`."""
    for kind, code in STATUS_CODES:
        if isinstance(error, kind):
            return code, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


class ErrorInterceptor(grpc.ServerInterceptor):
    """Wraps the handlers of services under `prefix` (ours; health and reflection abort alone)."""

    def __init__(self, prefix: str = "/intentserve.") -> None:
        self._prefix = prefix

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_streaming(handler.unary_stream, method))
        return handler


def _abort(context: grpc.ServicerContext, error: Exception, method: str) -> None:
    code, message = status_for(error)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    else:
        log.info("%s -> %s: %s", method, code.name, message)
    context.abort(code, message)


def _unary(behavior, method: str):
    def guarded(request, context):
        try:
            return behavior(request, context)
        except Exception as error:
            _abort(context, error, method)

    return guarded


def _streaming(behavior, method: str):
    def guarded(request, context):
        try:
            yield from behavior(request, context)
        except Exception as error:
            _abort(context, error, method)

    return guarded
