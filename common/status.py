"""Exceptions -> gRPC status codes: the interceptor both sides install on their servers.

Each side passes its own table (first match wins); handlers stay free of try/except. The
interceptor wraps only our services (`/intentserve.` methods): health and reflection abort alone.

A refused field (an error carrying a `field_violation`, intentserve.common.field_errors) ends its
call with the violation as a `google.rpc.BadRequest` detail beside the message.

Two kinds of bad input never reach a handler as an exception of its own, so the interceptor
answers them itself:
- a request that does not parse (invalid UTF-8 in a string, a truncated field) is
  INVALID_ARGUMENT naming the field (`malformed.describe_parse_error`), never grpc's INTERNAL
  "Exception deserializing request!";
- every status message is cut to MAX_STATUS_MESSAGE_BYTES, so a value a client sent (a
  100,000-character worker id) is never echoed whole and the status always fits in the
  trailers (grpc's metadata limit is 8 KiB, and grpc-message is percent-encoded).

`AsyncErrorInterceptor` does the same on a `grpc.aio` server (the controller's), whose handlers
are coroutines and async generators and where `context.abort` is awaited.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status
from intentserve.common.field_errors import FieldError, FieldViolation, details_of, violation_of
from intentserve.common.malformed import describe_parse_error

log = logging.getLogger(__name__)

StatusTable = Sequence[tuple[type[BaseException], grpc.StatusCode]]
MAX_STATUS_MESSAGE_BYTES = 1024
MAX_FIELD_PATH_BYTES = 256


class MalformedRequestError(FieldError):
    """The request's bytes do not parse; names the field (INVALID_ARGUMENT, with its
    BadRequest detail)."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


def lookup(table: StatusTable, error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a client sees for `error`: the first matching row, else INTERNAL."""
    code = getattr(error, "grpc_code", None)  # an error that already carries its status
    if isinstance(code, grpc.StatusCode):
        return code, str(error)
    for kind, status in table:
        if isinstance(error, kind):
            return status, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


def fit_status_message(message: str, limit_bytes: int = MAX_STATUS_MESSAGE_BYTES) -> str:
    """`message`, cut to at most `limit_bytes` of UTF-8 (at a character boundary) with a note
    saying how long it was."""
    data = message.encode("utf-8", "backslashreplace")
    if len(data) <= limit_bytes:
        return message
    note = f" [... cut: {len(data)} bytes in all]"
    head = data[: limit_bytes - len(note)].decode("utf-8", "ignore")
    return head + note


def status_details(error: BaseException) -> list[any_pb2.Any]:
    """`error`'s field violation as google.rpc.Status details (none without one), cut as status
    messages are: a value a client sent is never echoed whole."""
    violation = violation_of(error)
    if violation is None:
        return []
    return details_of(
        FieldViolation(
            fit_status_message(violation.field, MAX_FIELD_PATH_BYTES),
            fit_status_message(violation.description),
        )
    )


def rich_status(code: grpc.StatusCode, message: str, error: BaseException) -> grpc.Status | None:
    """The status `error` ends its call with, its field violation as a BadRequest detail (in the
    grpc-status-details-bin trailer); None when it carries none."""
    details = status_details(error)
    if not details:
        return None
    return rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message=message, details=details)
    )


class _Malformed:
    """What the tolerant deserializer hands the handler instead of raising."""

    def __init__(self, problem: FieldViolation) -> None:
        self.problem = problem


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that never raises: bytes that do not parse become a `_Malformed`."""
    message_type = getattr(deserializer, "__self__", None)  # generated code: Message.FromString
    descriptor = getattr(message_type, "DESCRIPTOR", None)
    if deserializer is None or descriptor is None:
        return deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:
            return _Malformed(describe_parse_error(descriptor, data))

    return deserialize


def _wrapped(handler, method: str, unary: Callable, streaming: Callable, bidi: Callable):
    """`handler` with its request parsed tolerantly and its behavior wrapped by the wrapper for
    its kind (`wrapper(behavior, method)`); a kind not listed passes unchanged."""
    for kind, wrapper in (
        ("unary_unary", unary),
        ("unary_stream", streaming),
        ("stream_stream", bidi),
    ):
        behavior = getattr(handler, kind)
        if behavior is not None:
            return handler._replace(
                request_deserializer=_tolerant(handler.request_deserializer),
                **{kind: wrapper(behavior, method)},
            )
    return handler


def _status(table: StatusTable, error: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status `error` becomes (message cut to fit), logged: INTERNAL with its traceback."""
    code, message = lookup(table, error)
    message = fit_status_message(message)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    else:
        log.info("%s -> %s: %s", method, code.name, message)
    return code, message


class ErrorInterceptor(grpc.ServerInterceptor):
    def __init__(self, table: StatusTable, prefix: str = "/intentserve.") -> None:
        self._table = table
        self._prefix = prefix

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        return _wrapped(handler, method, self._unary, self._streaming, self._bidi)

    def _abort(self, context: grpc.ServicerContext, error: Exception, method: str) -> None:
        code, message = _status(self._table, error, method)
        rich = rich_status(code, message, error)
        if rich is not None:
            context.abort_with_status(rich)
        context.abort(code, message)

    def _unary(self, behavior, method: str):
        def guarded(request, context):
            try:
                return behavior(_parsed(request), context)
            except Exception as error:
                self._abort(context, error, method)

        return guarded

    def _streaming(self, behavior, method: str):
        def guarded(request, context):
            try:
                yield from behavior(_parsed(request), context)
            except Exception as error:
                self._abort(context, error, method)

        return guarded

    def _bidi(self, behavior, method: str):
        def guarded(request_iterator, context):
            try:
                yield from behavior(map(_parsed, request_iterator), context)
            except Exception as error:
                self._abort(context, error, method)

        return guarded


class AsyncErrorInterceptor(grpc.aio.ServerInterceptor):
    """ErrorInterceptor for a grpc.aio server: the same table, parsing and message cut."""

    def __init__(self, table: StatusTable, prefix: str = "/intentserve.") -> None:
        self._table = table
        self._prefix = prefix

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        return _wrapped(handler, method, self._unary, self._streaming, self._bidi)

    async def _abort(self, context: grpc.aio.ServicerContext, error: Exception, method: str):
        code, message = _status(self._table, error, method)
        rich = rich_status(code, message, error)
        if rich is not None:
            await context.abort(code, message, rich.trailing_metadata)
        await context.abort(code, message)

    def _unary(self, behavior, method: str):
        async def guarded(request, context):
            try:
                return await behavior(_parsed(request), context)
            except grpc.aio.AbortError:
                raise  # the handler set its status itself
            except Exception as error:
                await self._abort(context, error, method)

        return guarded

    def _streaming(self, behavior, method: str):
        return self._writing(behavior, method, _parsed)

    def _bidi(self, behavior, method: str):
        return self._writing(behavior, method, _aparsed)

    def _writing(self, behavior, method: str, parse):
        """A handler that writes what `behavior` yields: server streaming (one request, `parse`
        = `_parsed`) and bidi (a request stream, `_aparsed`) alike."""

        async def guarded(request, context):
            try:
                await write_all(behavior(parse(request), context), context)
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await self._abort(context, error, method)

        return guarded


async def write_all(result: Any, context: grpc.aio.ServicerContext) -> None:
    """Send a streaming handler's responses with `context.write`, whichever way it streams (an
    async generator, or a coroutine that writes itself).

    NOTE: grpc iterates a handler's async generator in its own frame; when the client cancels
    there, the generator is only closed once collected. Here the cancel lands in this frame and
    `aclosing` closes the generator at once, so its `finally` (a worker's request cancelled,
    a metric counted) runs now."""
    if inspect.isasyncgen(result):
        async with contextlib.aclosing(result) as responses:
            async for response in responses:
                await context.write(response)
    elif inspect.isawaitable(result):
        await result
    else:
        raise TypeError(f"a streaming handler returned {type(result).__name__}")


async def _aparsed(requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _parsed(request)


def _parsed(request: Any) -> Any:
    if isinstance(request, _Malformed):
        raise MalformedRequestError(request.problem.field, request.problem.description)
    return request
