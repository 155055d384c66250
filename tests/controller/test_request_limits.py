"""The sizes a router checks before a request reaches a worker (request_size.py, nesting.py): turns,
tools, characters against the deployment's max_model_len, JSON nesting in every field that holds
JSON, and a Detokenize's ids. Each refusal names the field and what is allowed; a request at
each bound passes."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2
from intentserve.controller.errors import RequestTooLarge
from intentserve.controller.router.http.errors import from_validation
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.tokenize import TokenizeRequest
from intentserve.controller.router.nesting import MAX_JSON_DEPTH, struct_over, text_over
from intentserve.controller.router.request_size import (
    MAX_MESSAGES,
    MAX_TOKEN_CHARS,
    MAX_TOOLS,
    check_detokenize,
    check_request,
)
from intentserve.v1 import inference_pb2
from pydantic import ValidationError

MAX_MODEL_LEN = 64
WHAT = {"messages": "turns", "tools": "tools"}
MAX_CHARS = MAX_MODEL_LEN * MAX_TOKEN_CHARS


def nested(depth: int, leaf: object = 1) -> object:
    """A JSON value of `depth` levels of objects."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def turn(content: str = "Hi", **fields) -> inference_pb2.ChatMessage:
    return inference_pb2.ChatMessage(role="user", content=content, **fields)


def kwargs(value: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


def schema_request(schema_text: str) -> inference_pb2.GenerateRequest:
    constraint = inference_pb2.OutputConstraint(json_schema=schema_text)
    return inference_pb2.GenerateRequest(
        prompt="Hi", sampling=inference_pb2.SamplingParams(constraint=constraint)
    )


def tool(parameters: str = "", description: str = "") -> inference_pb2.Tool:
    return inference_pb2.Tool(name="f", description=description, parameters=parameters)


def call_turn(arguments: str) -> inference_pb2.ChatMessage:
    call = inference_pb2.ToolCall(id="c1", name="f", arguments=arguments)
    return inference_pb2.ChatMessage(role="assistant", tool_calls=[call])


DEEP = json.dumps(nested(MAX_JSON_DEPTH + 1))
AT_DEPTH = json.dumps(nested(MAX_JSON_DEPTH))
# Each case: the request, the field named, and what the message says is allowed.
REFUSED = {
    "turns": (
        inference_pb2.GenerateRequest(messages=[turn()] * (MAX_MESSAGES + 1)),
        "messages",
        f"allowed: at most {MAX_MESSAGES} turns",
    ),
    "tools": (
        inference_pb2.GenerateRequest(messages=[turn()], tools=[tool()] * (MAX_TOOLS + 1)),
        "tools",
        f"allowed: at most {MAX_TOOLS} tools",
    ),
    "prompt characters": (
        inference_pb2.GenerateRequest(prompt="a" * (MAX_CHARS + 1)),
        "prompt",
        f"allowed: at most {MAX_CHARS} characters",
    ),
    "turn characters": (
        inference_pb2.GenerateRequest(messages=[turn("a" * MAX_CHARS), turn("b")]),
        "messages",
        f"allowed: at most {MAX_CHARS} characters",
    ),
    "tool characters": (
        inference_pb2.GenerateRequest(messages=[turn()], tools=[tool(description="d" * MAX_CHARS)]),
        "tools",
        f"allowed: at most {MAX_CHARS} characters",
    ),
    "template variable characters": (
        inference_pb2.GenerateRequest(
            messages=[turn()], chat_template_kwargs=kwargs({"system": "s" * MAX_CHARS})
        ),
        "chat_template_kwargs",
        f"allowed: at most {MAX_CHARS} characters",
    ),
    "schema nesting": (
        schema_request(DEEP),
        "sampling.constraint.json_schema",
        f"allowed: at most {MAX_JSON_DEPTH} levels",
    ),
    "a 26,000-deep schema": (
        schema_request('{"a":' * 26000 + "1" + "}" * 26000),
        "sampling.constraint.json_schema",
        f"allowed: at most {MAX_JSON_DEPTH} levels",
    ),
    "tool parameters nesting": (
        inference_pb2.GenerateRequest(messages=[turn()], tools=[tool(), tool(parameters=DEEP)]),
        "tools[1].parameters",
        f"allowed: at most {MAX_JSON_DEPTH} levels",
    ),
    "tool call arguments nesting": (
        inference_pb2.GenerateRequest(messages=[turn(), call_turn(DEEP)]),
        "messages[1].tool_calls[0].arguments",
        f"allowed: at most {MAX_JSON_DEPTH} levels",
    ),
    "template variables nesting": (
        inference_pb2.GenerateRequest(
            messages=[turn()], chat_template_kwargs=kwargs(nested(MAX_JSON_DEPTH + 1))
        ),
        "chat_template_kwargs",
        f"allowed: at most {MAX_JSON_DEPTH} levels",
    ),
    "tokenize characters": (
        inference_pb2.TokenizeRequest(prompt="a" * (MAX_CHARS + 1)),
        "prompt",
        f"allowed: at most {MAX_CHARS} characters",
    ),
    "tokenize turns": (
        inference_pb2.TokenizeRequest(messages=[turn()] * (MAX_MESSAGES + 1)),
        "messages",
        f"allowed: at most {MAX_MESSAGES} turns",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_request_over_a_bound_is_refused_naming_the_field_and_what_is_allowed(case):
    request, field, allowed = REFUSED[case]
    with pytest.raises(RequestTooLarge) as error:
        check_request(request, MAX_MODEL_LEN)
    assert error.value.field == field
    assert allowed in error.value.field_violation.description


# Each at its bound: nothing is refused.
AT_BOUNDS = {
    "turns": inference_pb2.GenerateRequest(messages=[turn()] * MAX_MESSAGES),
    "tools": inference_pb2.GenerateRequest(messages=[turn()], tools=[tool()] * MAX_TOOLS),
    "characters": inference_pb2.GenerateRequest(
        messages=[turn("a" * (MAX_CHARS - 5)), turn("bb")], tools=[tool(description="cc")]
    ),
    "schema nesting": schema_request(AT_DEPTH),
    "brackets in a schema's strings": schema_request(
        json.dumps({"description": "[[[{{{" * MAX_JSON_DEPTH, "quote": '"\\[[['})
    ),
    "tool parameters nesting": inference_pb2.GenerateRequest(
        messages=[turn(), call_turn(AT_DEPTH)], tools=[tool(parameters=AT_DEPTH)]
    ),
    "template variables nesting": inference_pb2.GenerateRequest(
        messages=[turn()], chat_template_kwargs=kwargs(nested(MAX_JSON_DEPTH))
    ),
    "token ids": inference_pb2.GenerateRequest(prompt_token_ids=[7] * (MAX_CHARS + 1)),
}


@pytest.mark.parametrize("case", sorted(AT_BOUNDS))
def test_a_request_at_each_bound_passes(case):
    check_request(AT_BOUNDS[case], MAX_MODEL_LEN)


def test_without_a_known_max_model_len_only_the_characters_go_unchecked():
    check_request(inference_pb2.GenerateRequest(prompt="a" * (MAX_CHARS + 1)), 0)
    with pytest.raises(RequestTooLarge):
        check_request(inference_pb2.GenerateRequest(messages=[turn()] * (MAX_MESSAGES + 1)), 0)


def test_a_detokenize_of_more_ids_than_max_model_len_is_refused_naming_tokens():
    check_detokenize(inference_pb2.DetokenizeRequest(tokens=[1] * MAX_MODEL_LEN), MAX_MODEL_LEN)
    with pytest.raises(RequestTooLarge) as error:
        check_detokenize(
            inference_pb2.DetokenizeRequest(tokens=[1] * (MAX_MODEL_LEN + 1)), MAX_MODEL_LEN
        )
    assert error.value.field == "tokens"
    assert f"allowed: at most {MAX_MODEL_LEN} ids" in error.value.field_violation.description


@pytest.mark.parametrize(
    ("text", "over"),
    [
        (AT_DEPTH, False),
        (DEEP, True),
        (json.dumps([[1, {"b": []}]] * 50), False),  # wide, not deep
        ("[" * (MAX_JSON_DEPTH - 2) + "[1, {}]" + "]" * (MAX_JSON_DEPTH - 2), False),
        ("[" * (MAX_JSON_DEPTH - 1) + "[1, {}]" + "]" * (MAX_JSON_DEPTH - 1), True),
        # Brackets inside strings do not count, escaped quotes and backslashes neither.
        (json.dumps(["]" * 40, "[" * 40, '"[[[[', "\\", "\\[" * 40]), False),
        ("[" * 40, False),  # unbalanced: not JSON, which the worker's own check names
        ('["' + "[" * 40, False),  # an unterminated string: not JSON either
    ],
)
def test_the_depth_of_json_text_is_read_from_its_skeleton(text, over):
    assert text_over(text) is over


def test_the_depth_of_a_struct_counts_objects_and_lists():
    assert not struct_over(kwargs(nested(MAX_JSON_DEPTH)))
    assert struct_over(kwargs(nested(MAX_JSON_DEPTH + 1)))
    assert struct_over(kwargs({"a": [nested(MAX_JSON_DEPTH - 1)]}))


@pytest.mark.parametrize(
    ("schema", "field", "bound"),
    [
        (ChatCompletionRequest, "messages", MAX_MESSAGES),
        (ChatCompletionRequest, "tools", MAX_TOOLS),
        (TokenizeRequest, "messages", MAX_MESSAGES),
        (TokenizeRequest, "tools", MAX_TOOLS),
    ],
)
def test_an_http_body_of_too_many_turns_or_tools_is_refused_before_they_are_read(
    schema, field, bound
):
    """Found measuring: 250,000 turns took the router's event loop 0.9 s to validate and as
    long again to convert, before the router's own count refused them. The count comes first
    now: the last item is not even read (its error would have been named)."""
    items = {
        "messages": {"role": "user", "content": "Hi"},
        "tools": {"type": "function", "function": {"name": "f"}},
    }
    body = {"model": "m", "messages": [items["messages"]]}
    body[field] = [items[field]] * bound + [{"unknown": 1}]
    with pytest.raises(ValidationError) as info:
        schema.model_validate_json(json.dumps(body))
    error = from_validation(info.value, schema)
    assert error.param == field
    assert (
        error.message
        == f"{field}: {bound + 1} {WHAT[field]}; allowed: at most {bound} {WHAT[field]}"
    )
