"""One interceptor turns exceptions into status codes, for unary and server-streaming handlers."""

import collections

import grpc
import pytest
from intentserve.controller.service.errors import (
    NotReady,
    Overloaded,
    UnknownWorker,
    UpstreamError,
    WorkerUnavailable,
    WrongState,
)
from intentserve.controller.service.interceptor import STATUS_CODES
from intentserve.policy import IntentError, PolicyViolationError, Reason, ReasonCode
from intentserve.status import ErrorInterceptor, lookup

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
