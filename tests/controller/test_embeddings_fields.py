"""No field of OpenAI's embeddings request is accepted and dropped: each value that asks for
something reaches the EmbedRequest the worker gets (or the reply's shape), or is refused naming
it. The table is checked against the installed official `openai` SDK's typed params, so that a
field the SDK can send and this table misses fails here."""

from __future__ import annotations

import base64
import struct

import pytest
from intentserve.controller.router.http.embeddings import (
    EmbeddingsRequest,
    encode,
    field_name,
)
from intentserve.controller.router.http.errors import from_validation
from openai.types import embedding_create_params
from pydantic import ValidationError

MODEL = "minilm-l6"

# Each field: a value that asks for something, and what the EmbedRequest (or body) must say.
FIELDS = {
    "input": (["a", "b"], lambda body, pb: list(pb.texts) == ["a", "b"]),
    "model": (MODEL, lambda body, pb: body.model == MODEL),
    "dimensions": (384, lambda body, pb: pb.HasField("dimensions") and pb.dimensions == 384),
    "encoding_format": ("base64", lambda body, pb: body.encoding_format == "base64"),
    # A label for the client's own accounting: it asks the server for nothing.
    "user": ("client-7", lambda body, pb: body.user == "client-7"),
}


def test_the_table_covers_every_field_the_sdk_sends():
    assert set(FIELDS) == set(embedding_create_params.EmbeddingCreateParams.__annotations__)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_field_reaches_the_worker_or_the_reply(name):
    value, check = FIELDS[name]
    body = EmbeddingsRequest.model_validate({"model": MODEL, "input": "x", name: value})
    assert body.unsupported() is None
    assert check(body, body.to_pb())


@pytest.mark.parametrize(
    "given, texts, ids",
    [
        ("one", ["one"], []),
        (["one", "two"], ["one", "two"], []),
        ([101, 7, 102], [], [[101, 7, 102]]),
        ([[101, 102], [101, 5, 102]], [], [[101, 102], [101, 5, 102]]),
    ],
)
def test_every_input_shape_the_sdk_types_is_taken_whole(given, texts, ids):
    pb = EmbeddingsRequest.model_validate({"model": MODEL, "input": given}).to_pb()
    assert list(pb.texts) == texts and [list(t.ids) for t in pb.token_inputs] == ids


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": [1, -2]}, "input"),
        ({"input": "x", "truncate": True}, "truncate"),
        ({"input": "x", "extra": 1}, "extra"),
    ],
)
def test_a_value_out_of_range_or_a_field_not_known_is_refused_naming_it(body, param):
    with pytest.raises(ValidationError) as error:
        EmbeddingsRequest.model_validate({"model": MODEL, **body})
    assert from_validation(error.value, EmbeddingsRequest).param.startswith(param)


def test_an_empty_input_list_is_refused_naming_input():
    refused = EmbeddingsRequest.model_validate({"model": MODEL, "input": []}).unsupported()
    assert refused is not None and refused.param == "input"


def test_the_workers_field_paths_are_the_bodys_names():
    assert field_name("texts[3]") == "input[3]"
    assert field_name("token_inputs[0]") == "input[0]"
    assert field_name("dimensions") == "dimensions"
    assert field_name("request_id") is None


def test_base64_is_the_float32_values_little_endian():
    values = [0.5, -1.25, 3.0]
    assert encode(values, "float") == values
    raw = base64.b64decode(encode(values, "base64"))
    assert struct.unpack("<3f", raw) == (0.5, -1.25, 3.0)
