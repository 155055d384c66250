"""One interceptor turns exceptions into status codes, for unary and server-streaming handlers;
its aio twin (the controller's) does the same for coroutines and async generators."""

import asyncio
import collections

import grpc
import pytest
from intentserve.common.status import (
    MAX_STATUS_MESSAGE_BYTES,
    AsyncErrorInterceptor,
    ErrorInterceptor,
    lookup,
)
from intentserve.controller.errors import (
    NotReady,
    Overloaded,
    UnknownWorker,
    UpstreamError,
    WorkerUnavailable,
    WrongState,
)
from intentserve.controller.status_codes import STATUS_CODES
from intentserve.policy import IntentError, PolicyViolationError, Reason, ReasonCode
from intentserve.v1 import admin_pb2

REASON = Reason(ReasonCode.MODEL_HAS_NO_KV_CACHE, "the model (BertModel) has no KV cache")
Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (PolicyViolationError(REASON), Code.FAILED_PRECONDITION, REASON.message),
        (IntentError("block_size", "too big"), Code.INVALID_ARGUMENT, "block_size: too big"),
        (ValueError("capability: must be set"), Code.INVALID_ARGUMENT, None),
        (NotReady(REASON), Code.UNAVAILABLE, f"deployment is not ready: {REASON}"),
        (WorkerUnavailable("worker w0 was lost"), Code.UNAVAILABLE, None),
        (Overloaded("every queue is full"), Code.RESOURCE_EXHAUSTED, None),
        (UnknownWorker("ghost"), Code.NOT_FOUND, "unknown worker 'ghost'"),
        (WrongState("worker 'w0' is lost"), Code.FAILED_PRECONDITION, None),
        (UpstreamError(Code.OUT_OF_RANGE, "worker w0: too long"), Code.OUT_OF_RANGE, None),
        (KeyError("oops"), Code.INTERNAL, "internal error: KeyError: 'oops'"),
        (RuntimeError("boom"), Code.INTERNAL, "internal error: RuntimeError: boom"),
    ],
)
def test_each_error_kind_has_its_status_code(error, code, message):
    assert lookup(STATUS_CODES, error) == (code, message if message is not None else str(error))


class _Aborted(Exception):
    pass


class FakeContext:
    def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted

    def abort_with_status(self, status):
        self.trailing_metadata = status.trailing_metadata
        self.abort(status.code, status.details)


Details = collections.namedtuple("Details", "method invocation_metadata")


def intercept(handler, method="/intentserve.v1.Admin/Status"):
    return ErrorInterceptor(STATUS_CODES).intercept_service(lambda _: handler, Details(method, ()))


def failing(*args):
    raise NotReady(REASON)


def test_unary_handlers_are_wrapped():
    handler = intercept(grpc.unary_unary_rpc_method_handler(failing))
    context = FakeContext()
    with pytest.raises(_Aborted):
        handler.unary_unary(None, context)
    assert (context.code, context.details) == lookup(STATUS_CODES, NotReady(REASON))


def test_streaming_handlers_are_wrapped_after_their_first_responses():
    def stream(request, context):
        yield 1
        raise WorkerUnavailable("worker w0 was lost mid-stream")

    handler = intercept(grpc.unary_stream_rpc_method_handler(stream))
    context = FakeContext()
    responses = handler.unary_stream(None, context)
    assert next(responses) == 1
    with pytest.raises(_Aborted):
        next(responses)
    assert context.code is Code.UNAVAILABLE
    assert context.details == "worker w0 was lost mid-stream"


def test_other_services_are_left_alone():
    handler = grpc.unary_unary_rpc_method_handler(failing)
    assert intercept(handler, "/grpc.health.v1.Health/Check") is handler
    assert intercept(None) is None


class AsyncContext:
    async def abort(self, code, details, trailing_metadata=()):
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata
        raise _Aborted


def aintercept(handler, method="/intentserve.v1.Admin/Status"):
    async def continuation(_):
        return handler

    interceptor = AsyncErrorInterceptor(STATUS_CODES)
    return asyncio.run(interceptor.intercept_service(continuation, Details(method, ())))


async def afailing(*args):
    raise NotReady(REASON)


def test_async_unary_handlers_are_wrapped():
    handler = aintercept(grpc.unary_unary_rpc_method_handler(afailing))
    context = AsyncContext()
    with pytest.raises(_Aborted):
        asyncio.run(handler.unary_unary(None, context))
    assert (context.code, context.details) == lookup(STATUS_CODES, NotReady(REASON))


def test_async_streaming_handlers_are_wrapped_after_their_first_responses():
    closed = []

    async def stream(request, context):
        try:
            yield 1
            raise WorkerUnavailable("worker w0 was lost mid-stream")
        finally:
            closed.append(True)

    handler = aintercept(grpc.unary_stream_rpc_method_handler(stream))
    context = AsyncContext()
    written = []

    async def write(response):
        written.append(response)

    context.write = write
    with pytest.raises(_Aborted):
        asyncio.run(handler.unary_stream(None, context))
    assert written == [1]
    assert closed == [True]
    assert context.code is Code.UNAVAILABLE
    assert context.details == "worker w0 was lost mid-stream"


def test_async_streams_are_closed_at_once_when_the_client_goes_away():
    # A cancel arriving while a response is written must run the stream's `finally` now.
    closed = []

    async def stream(request, context):
        try:
            while True:
                yield 1
        finally:
            closed.append(True)

    handler = aintercept(grpc.unary_stream_rpc_method_handler(stream))
    context = AsyncContext()

    async def write(response):
        await asyncio.sleep(10)

    context.write = write

    async def cancel_mid_write():
        task = asyncio.ensure_future(handler.unary_stream(None, context))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed == [True]

    asyncio.run(cancel_mid_write())


def test_async_malformed_requests_and_long_messages():
    descriptor_type = admin_pb2.ExplainRequest

    async def explain(request, context):
        raise UnknownWorker("w" * 5000)

    handler = aintercept(
        grpc.unary_unary_rpc_method_handler(
            explain, request_deserializer=descriptor_type.FromString
        ),
        "/intentserve.v1.Admin/Explain",
    )
    malformed = handler.request_deserializer(b"\x0a\x02\xff\xfe")  # worker_id: invalid UTF-8
    context = AsyncContext()
    with pytest.raises(_Aborted):
        asyncio.run(handler.unary_unary(malformed, context))
    assert context.code is Code.INVALID_ARGUMENT
    assert "worker_id" in context.details
    with pytest.raises(_Aborted):
        asyncio.run(handler.unary_unary(descriptor_type(worker_id="w"), context))
    assert context.code is Code.NOT_FOUND
    assert len(context.details.encode()) <= MAX_STATUS_MESSAGE_BYTES
    assert "cut" in context.details


def test_async_other_services_are_left_alone():
    handler = grpc.unary_unary_rpc_method_handler(afailing)
    assert aintercept(handler, "/grpc.health.v1.Health/Check") is handler
    assert aintercept(None) is None
