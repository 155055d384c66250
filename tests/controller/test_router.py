"""Inference requests are validated before any routing, and a bad field is named."""

import math

import pytest
from intentserve.controller.service.errors import InvalidRequest
from intentserve.controller.service.router import validate
from intentserve.v1 import inference_pb2


def request(prompt="hi", token_ids=(), max_tokens=4, temperature=0.0, top_p=0.0):
    return inference_pb2.GenerateRequest(
        prompt=prompt,
        prompt_token_ids=list(token_ids),
        sampling=inference_pb2.SamplingParams(temperature=temperature, top_p=top_p),
        stop=inference_pb2.StopConditions(max_tokens=max_tokens),
    )


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (request(prompt=""), "prompt"),
        (request(max_tokens=0), "stop.max_tokens"),
        (request(temperature=-0.5), "sampling.temperature"),
        (request(temperature=math.nan), "sampling.temperature"),
        (request(top_p=1.5), "sampling.top_p"),
        (request(top_p=-0.1), "sampling.top_p"),
        (request(top_p=math.nan), "sampling.top_p"),
    ],
)
def test_invalid_fields_are_named(bad, field):
    with pytest.raises(InvalidRequest, match=f"^{field}: ") as error:
        validate(bad)
    assert error.value.field == field


@pytest.mark.parametrize(
    "good",
    [
        request(),
        request(prompt="", token_ids=[1, 2, 3]),
        request(temperature=0.7, top_p=1.0),
        request(top_p=0.0),  # 0 means unset
        request(temperature=2.0, top_p=0.01),
    ],
)
def test_valid_requests_pass_as_sent(good):
    sent = inference_pb2.GenerateRequest()
    sent.CopyFrom(good)
    assert validate(good) is None
    assert good == sent  # nothing defaulted or clamped (top_p 0 stays unset) on the way to a worker
