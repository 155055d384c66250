"""A refused field crosses gRPC as a typed detail: the shared interceptors (the worker's, and
the controller's aio one) end the call with a google.rpc.BadRequest field violation naming the
field, beside the message; a client reads the field from the detail. Errors that name no field
carry none, and a violation's text is cut as status messages are."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from intentserve.common.field_errors import FieldError, FieldViolation, violation_of
from intentserve.common.status import (
    MAX_STATUS_MESSAGE_BYTES,
    AsyncErrorInterceptor,
    ErrorInterceptor,
)
from intentserve.v1 import inference_pb2, inference_pb2_grpc

TABLE = ((ValueError, grpc.StatusCode.INVALID_ARGUMENT),)
REFUSED = FieldError("sampling.temperature", "-1.0 is below 0")


class Refusing(inference_pb2_grpc.InferenceServicer):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def Generate(self, request, context):
        raise self.error
        yield  # a streaming handler


class AsyncRefusing(inference_pb2_grpc.InferenceServicer):
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def Generate(self, request, context):
        raise self.error
        yield  # a streaming handler


def _call_sync(error: Exception, raw: bytes | None = None) -> grpc.RpcError:
    """Generate on a server whose handler raises `error`; `raw`: these bytes sent as the
    request instead of a GenerateRequest."""
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[ErrorInterceptor(TABLE)])
    inference_pb2_grpc.add_InferenceServicer_to_server(Refusing(error), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            generate = channel.unary_stream(
                "/intentserve.v1.Inference/Generate",
                request_serializer=None,
                response_deserializer=inference_pb2.GenerateResponse.FromString,
            )
            data = inference_pb2.GenerateRequest(prompt="x").SerializeToString()
            with pytest.raises(grpc.RpcError) as info:
                list(generate(data if raw is None else raw, timeout=10))
    finally:
        server.stop(0)
    return info.value


def _call_async(error: Exception) -> grpc.RpcError:
    async def run() -> grpc.RpcError:
        server = grpc.aio.server(interceptors=[AsyncErrorInterceptor(TABLE)])
        inference_pb2_grpc.add_InferenceServicer_to_server(AsyncRefusing(error), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                try:
                    await asyncio.to_thread(
                        lambda: list(stub.Generate(inference_pb2.GenerateRequest(), timeout=10))
                    )
                except grpc.RpcError as failure:
                    return failure
        finally:
            await server.stop(0)
        raise AssertionError("the call did not fail")

    return asyncio.run(run())


CALLS = pytest.mark.parametrize("call", [_call_sync, _call_async], ids=["sync", "aio"])


@CALLS
def test_a_refused_field_is_a_bad_request_detail_naming_it(call):
    error = call(REFUSED)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "sampling.temperature: -1.0 is below 0"
    status = rpc_status.from_call(error)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("sampling.temperature", "-1.0 is below 0")
    ]
    assert violation_of(error) == FieldViolation("sampling.temperature", "-1.0 is below 0")


@CALLS
def test_an_error_that_names_no_field_carries_no_detail(call):
    error = call(ValueError("sampling.temperature: looks like a field, but is only text"))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_status.from_call(error) is None and violation_of(error) is None


def test_a_long_description_is_cut_in_the_detail_too():
    error = _call_sync(FieldError("prompt", "x" * 100_000))
    violation = violation_of(error)
    assert violation.field == "prompt"
    assert len(violation.description.encode()) <= MAX_STATUS_MESSAGE_BYTES
    assert "cut" in violation.description


def test_bytes_that_do_not_parse_name_the_field_in_the_detail_too():
    error = _call_sync(REFUSED, raw=b"\x2a\x05\x1a\x03\xc3\x28!")  # stop.stop: not UTF-8
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("stop.stop: is not valid UTF-8")
    assert violation_of(error).field == "stop.stop"
