"""Exceptions -> gRPC status codes: the interceptor both sides install on their servers.

Each side passes its own table (first match wins); handlers stay free of try/except. The
interceptor wraps only our services (`/intentserve.` methods): health and reflection abort alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import grpc

log = logging.getLogger(__name__)

StatusTable = Sequence[tuple[type[BaseException], grpc.StatusCode]]


def lookup(table: StatusTable, error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a client sees for `error`: the first matching row, else INTERNAL."""
    code = getattr(error, "grpc_code", None)  # an error that already carries its status
    if isinstance(code, grpc.StatusCode):
        return code, str(error)
    for kind, status in table:
        if isinstance(error, kind):
            return status, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


class ErrorInterceptor(grpc.ServerInterceptor):
    def __init__(self, table: StatusTable, prefix: str = "/intentserve.") -> None:
        self._status_for: Callable[[BaseException], tuple[grpc.StatusCode, str]] = lambda error: (
            lookup(table, error)
        )
        self._prefix = prefix

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(handler.unary_stream, method))
        return handler

    def _abort(self, context: grpc.ServicerContext, error: Exception, method: str) -> None:
        code, message = self._status_for(error)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("%s failed", method)
        else:
            log.info("%s -> %s: %s", method, code.name, message)
        context.abort(code, message)

    def _unary(self, behavior, method: str):
        def guarded(request, context):
            try:
                return behavior(request, context)
            except Exception as error:
                self._abort(context, error, method)

        return guarded

    def _streaming(self, behavior, method: str):
        def guarded(request, context):
            try:
                yield from behavior(request, context)
            except Exception as error:
                self._abort(context, error, method)

        return guarded
