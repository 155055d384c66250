"""Proto <-> engine conversion and the exception -> status mapping; no model, no server."""

from __future__ import annotations

import math

import grpc
import pytest
from intentserve.policy import IntentError, PagedAttentionRequiredError, Reason, ReasonCode
from intentserve.v1 import inference_pb2
from intentserve.worker.engine.request import RequestOutput
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoad, EngineLoopClosedError
from intentserve.worker.service.interceptor import status_for
from intentserve.worker.service.servicer import WorkerOverloadedError


class FakeTokenizer:
    vocab_size = 100

    def apply_chat_template(self, messages):
        return f"<user>{messages[0]['content']}</user><assistant>"


def request(**fields) -> inference_pb2.GenerateRequest:
    fields.setdefault("prompt", "Hello")
    fields.setdefault("stop", inference_pb2.StopConditions(max_tokens=4))
    return inference_pb2.GenerateRequest(**fields)


def decode(msg: inference_pb2.GenerateRequest):
    return convert.generate_request_from_pb(msg, FakeTokenizer())


def test_defaults_and_carried_fields():
    prompt, params, request_id = decode(
        request(
            request_id="r1",
            sampling=inference_pb2.SamplingParams(temperature=0.5, top_k=7, seed=3),
            stop=inference_pb2.StopConditions(
                max_tokens=9, stop_token_ids=[5], stop=["\n"], ignore_eos=True
            ),
        )
    )
    assert (prompt, request_id) == ("Hello", "r1")
    assert params.max_tokens == 9 and params.top_k == 7 and params.seed == 3
    assert params.temperature == pytest.approx(0.5)
    assert params.top_p == 1.0  # 0 on the wire means "not set"
    assert params.stop_token_ids == (5,) and params.stop == ("\n",) and params.ignore_eos


def test_unset_seed_and_generated_request_ids():
    _, params, first = decode(request())
    _, _, second = decode(request())
    assert params.seed is None and params.temperature == 0.0
    assert first and second and first != second


def test_token_ids_take_precedence_and_chat_renders_one_user_message():
    assert decode(request(prompt="ignored", prompt_token_ids=[1, 2]))[0] == [1, 2]
    assert decode(request(prompt="Hi", chat=True))[0] == "<user>Hi</user><assistant>"


@pytest.mark.parametrize(
    ("fields", "field_path"),
    [
        ({"prompt": ""}, "prompt"),
        ({"stop": inference_pb2.StopConditions(max_tokens=0)}, "stop.max_tokens"),
        ({"stop": inference_pb2.StopConditions(max_tokens=4, stop=[""])}, "stop.stop"),
        ({"sampling": inference_pb2.SamplingParams(temperature=-0.1)}, "sampling.temperature"),
        ({"sampling": inference_pb2.SamplingParams(temperature=math.nan)}, "sampling.temperature"),
        ({"sampling": inference_pb2.SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ({"prompt_token_ids": [1, 100]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1], "chat": True}, "chat"),
    ],
)
def test_invalid_fields_are_named_by_their_proto_path(fields, field_path):
    with pytest.raises(InvalidRequestError) as info:
        decode(request(**fields))
    assert info.value.field == field_path
    assert str(info.value).startswith(f"{field_path}: ")


def test_engine_errors_are_renamed_to_proto_paths():
    with (
        pytest.raises(InvalidRequestError, match=r"^stop\.max_tokens: 300 does not fit"),
        convert.proto_field_names(),
    ):
        raise InvalidRequestError("max_tokens", "300 does not fit")
    with (
        pytest.raises(InvalidRequestError, match=r"^request_id: taken"),
        convert.proto_field_names(),
    ):
        raise InvalidRequestError("request_id", "taken")


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (None, inference_pb2.FINISH_REASON_UNSPECIFIED),
        (FinishReason.STOP, inference_pb2.FINISH_REASON_STOP),
        (FinishReason.LENGTH, inference_pb2.FINISH_REASON_LENGTH),
        (FinishReason.ABORT, inference_pb2.FINISH_REASON_ABORT),
    ],
)
def test_response_finish_reason_and_counts(reason, expected):
    finished = reason is not None
    output = RequestOutput("r1", (4, 5), "ab", finished, reason, 7, 2)
    msg = convert.generate_response_to_pb(output, "w0")
    assert msg.finish_reason == expected
    assert (msg.request_id, list(msg.token_ids), msg.text) == ("r1", [4, 5], "ab")
    assert msg.worker_id == "w0"
    assert msg.num_output_tokens == 2
    assert msg.num_prompt_tokens == (7 if finished else 0)  # set on the last chunk only


def test_heartbeat_request_carries_the_load():
    msg = convert.heartbeat_request_to_pb("w0", EngineLoad(2, 1, 10, 91))
    assert (msg.worker_id, msg.num_running, msg.num_waiting) == ("w0", 2, 1)
    assert (msg.num_kv_used, msg.num_kv_total) == (10, 91)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequestError("prompt", "must not be empty"), grpc.StatusCode.INVALID_ARGUMENT),
        (ValueError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (IntentError("policy.mode", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (
            PagedAttentionRequiredError(Reason(ReasonCode.BACKEND_UNAVAILABLE, "no backend")),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (WorkerOverloadedError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (EngineLoopClosedError("closed"), grpc.StatusCode.UNAVAILABLE),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_codes(error, code):
    got_code, message = status_for(error)
    assert got_code == code
    assert str(error) in message
