"""The shared interceptor's answers to bad input: a request that does not parse is
INVALID_ARGUMENT naming the field; no status message outgrows its trailers; request ids are
bounded the same way on both sides."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError
from intentserve.common.ids import MAX_REQUEST_ID_CHARS, check_request_id, request_id_problem
from intentserve.common.malformed import describe_parse_error
from intentserve.common.status import MAX_STATUS_MESSAGE_BYTES, fit_status_message
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2

from tests.controller.conftest import FAST

REQUEST = inference_pb2.GenerateRequest.DESCRIPTOR


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x12\x03\xff\xfe\xfd", "prompt: is not valid UTF-8 (byte 0 of the value)"),
        (b"\x12\x03ab\xc3", "prompt: is not valid UTF-8 (byte 2 of the value)"),
        (b"\x0a\x01r\x2a\x05\x1a\x03\xc3\x28!", "stop.stop: is not valid UTF-8"),
        (b"\x12\x40hi", "prompt: its length (64 bytes) runs past the end"),
        (b"\x2a\x02\x08", "stop: its length (2 bytes) runs past the end"),
        (b"\x18\xff", "prompt_token_ids: the message ends inside a varint"),
        (b"\xff" * 11, "GenerateRequest: a varint longer than 10 bytes"),
        (b"\x0f", "request_id: wire type 7 is not valid here"),
        (b"\x00", "GenerateRequest: field number 0 is not valid"),
        (b"\xfa\x01\x01\xff\x12\x01\xff", "prompt: is not valid UTF-8"),  # unknown 31 skipped
    ],
)
def test_a_parse_error_names_the_field(data, problem):
    with pytest.raises(DecodeError):
        inference_pb2.GenerateRequest.FromString(data)
    violation = describe_parse_error(REQUEST, data)
    assert f"{violation.field}: {violation.description}".startswith(problem)


def _length_delimited(number: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
            n >>= 7
            if not n:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (inference_pb2.GenerateRequest, "chat_template_kwargs"),
        (inference_pb2.TokenizeRequest, "chat_template_kwargs"),
        (inference_pb2.GenerateCommand, "start.chat_template_kwargs"),  # GenerateMany's
    ],
)
def test_a_message_nested_past_what_protobuf_decodes_names_its_field(message, named):
    """A Struct nested 40 JSON levels (120 messages; protobuf decodes 100) in a request:
    refused naming the field that holds it, not the request as a whole."""
    value = b""
    for _ in range(40):  # Struct{fields: {"a": Value{struct_value: ...}}}
        entry = _length_delimited(1, b"a") + _length_delimited(2, _length_delimited(5, value))
        value = _length_delimited(1, entry)
    kwargs = REQUEST.fields_by_name["chat_template_kwargs"].number
    request = _length_delimited(2, b"hi") + _length_delimited(kwargs, value)
    if message is inference_pb2.TokenizeRequest:
        number = message.DESCRIPTOR.fields_by_name["chat_template_kwargs"].number
        request = _length_delimited(number, value)
    data = _length_delimited(2, request) if message is inference_pb2.GenerateCommand else request
    with pytest.raises(DecodeError):
        message.FromString(data)
    violation = describe_parse_error(message.DESCRIPTOR, data)
    assert violation.field == named
    assert "nested deeper than protobuf decodes" in violation.description


@pytest.mark.parametrize("size", [0, 10, MAX_STATUS_MESSAGE_BYTES])
def test_short_messages_are_left_alone(size):
    assert fit_status_message("é" * (size // 2)) == "é" * (size // 2)


@pytest.mark.parametrize("text", ["w" * 100_000, "東" * 40_000, "\udcff" * 5_000])
def test_long_messages_are_cut_to_the_limit_and_say_so(text):
    fitted = fit_status_message(f"unknown worker {text!r}")
    assert len(fitted.encode("utf-8", "backslashreplace")) <= MAX_STATUS_MESSAGE_BYTES
    assert fitted.startswith("unknown worker '") and fitted.endswith(" bytes in all]")


def test_request_ids_are_bounded_and_printable():
    assert check_request_id("req-1") == "req-1"
    assert request_id_problem("") is None  # unset: the receiver names the request
    assert request_id_problem("r" * MAX_REQUEST_ID_CHARS) is None
    assert request_id_problem("r" * (MAX_REQUEST_ID_CHARS + 1)) == "has 257 characters; at most 256"
    with pytest.raises(ValueError, match=r"^request_id: has 524288 characters; at most 256$"):
        check_request_id("r" * (512 << 10))
    with pytest.raises(ValueError, match=r"^request_id: must be printable"):
        check_request_id("a\r\nb")


@pytest.mark.integration
def test_drain_of_a_100000_character_worker_id_is_not_found_with_a_status_that_fits():
    server = ControllerServer(ControllerSettings(**FAST).config()).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                admin.Drain(admin_pb2.DrainRequest(worker_id="w" * 100_000), timeout=10)
    finally:
        server.stop(grace_s=0)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()
    assert info.value.details().startswith("unknown worker 'www")
    assert len(info.value.details().encode()) <= MAX_STATUS_MESSAGE_BYTES


def test_a_generate_nested_past_what_protobuf_decodes_is_invalid_argument_naming_the_field():
    """Through a real controller's gRPC front door: not INTERNAL ("Exception deserializing
    request!"), but INVALID_ARGUMENT naming the field."""
    value = b""
    for _ in range(40):
        entry = _length_delimited(1, b"a") + _length_delimited(2, _length_delimited(5, value))
        value = _length_delimited(1, entry)
    kwargs = REQUEST.fields_by_name["chat_template_kwargs"].number
    data = _length_delimited(2, b"hi") + _length_delimited(kwargs, value)
    server = ControllerServer(ControllerSettings(**FAST).config()).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            generate = channel.unary_stream(
                "/intentserve.v1.Inference/Generate",
                request_serializer=lambda raw: raw,
                response_deserializer=inference_pb2.GenerateResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as info:
                list(generate(data, timeout=10))
    finally:
        server.stop(grace_s=0)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith("chat_template_kwargs: nested deeper than protobuf")
