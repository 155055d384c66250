"""No field of OpenAI's Responses API request is accepted and dropped: each value that asks for
something reaches the GenerateRequest the worker gets (or the Response it is answered with), or
is refused with 400 naming it. The lists are checked against the installed `openai` SDK's typed
parameters: ResponseCreateParamsBase's fields, and the `type`s of its input item, content part,
tool, tool_choice and text.format unions, and the function tool's and `reasoning`'s fields."""

from __future__ import annotations

import json
import typing

import pytest
import typing_extensions
from intentserve.controller.router.http.errors import from_unsupported, from_validation
from intentserve.controller.router.http.reasoning_effort import EFFORT_BUDGETS
from intentserve.controller.router.http.responses_convert import conversation, to_pb
from intentserve.controller.router.http.responses_reply import ResponseReply
from intentserve.controller.router.http.responses_schema import ResponsesRequest
from openai.types.responses import (
    function_tool_param,
    response_create_params,
    response_format_text_config_param,
    response_input_message_content_list_param,
    response_input_param,
    tool_param,
)
from openai.types.shared_params import reasoning
from pydantic import ValidationError

MODEL = "smollm2-135m"
REFUSED = "refused"
HI = [{"role": "user", "content": "Hi"}]
F = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def sent(check):
    """A check of the GenerateRequest only."""
    return lambda pb, response: check(pb)


def answered(check):
    """A check of the Response object only."""
    return lambda pb, response: check(response)


ANYTHING = sent(lambda pb: True)
# Each field: a value that asks for something, and what must happen to it.
FIELDS = {
    "model": (MODEL, ANYTHING),  # another is 404 (test_responses_api)
    "input": (
        "Hi",
        sent(lambda pb: [(m.role, m.content) for m in pb.messages] == [("user", "Hi")]),
    ),
    "instructions": ("Be brief.", sent(lambda pb: pb.messages[0].content == "Be brief.")),
    "max_output_tokens": (7, sent(lambda pb: pb.stop.max_tokens == 7)),
    "temperature": (0.5, sent(lambda pb: pb.sampling.temperature == 0.5)),
    "top_p": (0.5, sent(lambda pb: pb.sampling.top_p == 0.5)),
    "tools": (
        [F],
        sent(
            lambda pb: [(t.name, t.parameters) for t in pb.tools] == [("f", '{"type": "object"}')]
        ),
    ),
    "tool_choice": ("required", sent(lambda pb: pb.tool_choice == 3)),
    # Without tools there is no call to hold to one (refused with tools under auto, below).
    "parallel_tool_calls": (False, sent(lambda pb: not pb.parallel_tool_calls)),
    "text": (
        {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer"}}},
        sent(lambda pb: json.loads(pb.sampling.constraint.json_schema) == {"type": "integer"}),
    ),
    "stream": (True, ANYTHING),  # the reply's shape (test_responses_api streams)
    "stream_options": ({"include_obfuscation": False}, ANYTHING),  # with stream: true
    "store": (False, answered(lambda r: r["store"] is False)),  # GET is 404 (test_responses_api)
    # An unknown one is 404 (test_responses_api); a stored one's turns are prepended, there too.
    "previous_response_id": ("resp_x", answered(lambda r: r["previous_response_id"] == "resp_x")),
    "metadata": ({"k": "v"}, answered(lambda r: r["metadata"] == {"k": "v"})),
    "user": ("me", answered(lambda r: r["user"] == "me")),  # a label: asks for nothing
    "safety_identifier": ("me", answered(lambda r: r["safety_identifier"] == "me")),
    "service_tier": ("default", answered(lambda r: r["service_tier"] == "default")),
    "truncation": ("disabled", answered(lambda r: r["truncation"] == "disabled")),
    "background": (True, REFUSED),
    "background_options": ({"completion_window": "2h"}, REFUSED),
    "conversation": ("conv_1", REFUSED),
    "include": (["message.output_text.logprobs"], REFUSED),
    "max_tool_calls": (3, REFUSED),
    "prompt": ({"id": "pmpt_1"}, REFUSED),
    "prompt_cache_key": ("k", REFUSED),
    "prompt_cache_options": ({"mode": "explicit"}, REFUSED),
    "prompt_cache_retention": ("24h", REFUSED),
    "reasoning": (
        {"effort": "low"},
        lambda pb, r: pb.reasoning_budget == 1024 and r["reasoning"]["effort"] == "low",
    ),
    "top_logprobs": (2, REFUSED),
    "context_management": ([{"type": "compaction"}], REFUSED),
    "access_programs": ({"cyber": "standard"}, REFUSED),
    "image": ({"context_compression": "auto"}, REFUSED),
    "moderation": ({"model": "omni-moderation-latest"}, REFUSED),
}
# Values of a field that ask for what is not done, refused naming that field (or its path).
REFUSED_VALUES = [
    ("truncation", "auto", "truncation"),
    ("service_tier", "flex", "service_tier"),
    ("tool_choice", {"type": "web_search_preview"}, "tool_choice"),
    ("tool_choice", "anything", "tool_choice"),
    ("stream_options", {"include_obfuscation": True}, "stream_options.include_obfuscation"),
    ("text", {"verbosity": "low"}, "text.verbosity"),
    ("text", {"format": {"type": "json_schema", "name": "n"}}, "text.format.schema"),
    ("top_p", 0, "top_p"),
    ("metadata", {f"k{i}": "v" for i in range(17)}, "metadata"),
    ("metadata", {"k": "v" * 513}, "metadata"),
]


def _body(name: str, value) -> dict:
    body = {"model": MODEL, "input": HI, name: value}
    if name == "stream_options":
        body["stream"] = True
    return body


def outcome(body: dict):
    """(GenerateRequest, Response object), or the OpenAIError of the refusal."""
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as error:
        return from_validation(error, ResponsesRequest)
    unsupported = request.unsupported()
    if unsupported is not None:
        return from_unsupported(unsupported)
    return to_pb(request, conversation(request)), ResponseReply(request).response()


def assert_refused(result, param: str) -> str:
    assert not isinstance(result, tuple), f"{param} was accepted"
    assert (result.status, result.param) == (400, param), result.message
    assert result.message.startswith(f"{param}: ")
    return result.message


def _literals(annotation) -> set[str]:
    found = set()
    for arg in typing.get_args(annotation):
        found |= {arg} if isinstance(arg, str) else _literals(arg)
    return found


def type_names(union) -> set[str]:
    """Every `type` value of a union of the SDK's TypedDicts."""
    members = [m for m in typing.get_args(union) if typing_extensions.is_typeddict(m)]
    names = set().union(*(_literals(typing.get_type_hints(m)["type"]) for m in members))
    assert names, f"no type names found in {union}"  # NOTE: else a parametrized test would skip
    return names


def test_every_published_field_is_listed_here():
    published = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert published == set(FIELDS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_field_is_honoured_or_refused_naming_it(name):
    value, expected = FIELDS[name]
    result = outcome(_body(name, value))
    if expected == REFUSED:
        assert_refused(result, name)
    else:
        assert isinstance(result, tuple), f"{name} was refused: {result.message}"
        assert expected(*result), f"{name} did not reach the request or the response"


@pytest.mark.parametrize(("name", "value", "param"), REFUSED_VALUES)
def test_a_value_that_asks_for_what_is_not_done_is_refused(name, value, param):
    assert_refused(outcome(_body(name, value)), param)


def test_a_field_no_schema_knows_is_refused_naming_it():
    message = assert_refused(outcome(_body("frobnicate", 1)), "frobnicate")
    assert "not honoured" in message


SERVED_ITEMS = {
    "message": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hi"}],
    },
    "function_call": {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    "function_call_output": {"type": "function_call_output", "call_id": "c1", "output": "9 C"},
    "reasoning": {"type": "reasoning", "id": "rs_1", "summary": []},
}


@pytest.mark.parametrize("kind", sorted(type_names(response_input_param.ResponseInputItemParam)))
def test_every_input_item_type_is_honoured_or_refused_naming_it(kind):
    item = SERVED_ITEMS.get(kind, {"type": kind, "id": "x"})
    result = outcome({"model": MODEL, "input": [*HI, item]})
    if kind in SERVED_ITEMS:
        assert isinstance(result, tuple), result.message
    else:
        assert repr(kind) in assert_refused(result, "input[1].type")


def test_the_served_items_become_the_turns_a_chat_would_send():
    items = [
        {"role": "developer", "content": "Use tools."},
        *HI,
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        },
    ]
    pb, _ = outcome({"model": MODEL, "instructions": "Be brief.", "input": items, "tools": [F]})
    turns = [
        (m.role, m.content, [(c.id, c.arguments) for c in m.tool_calls], m.tool_call_id)
        for m in pb.messages
    ]
    assert turns == [
        ("system", "Be brief.", [], ""),
        ("system", "Use tools.", [], ""),  # developer is the system turn's newer name
        ("user", "Hi", [], ""),
        ("assistant", "", [("c1", '{"a": 1}'), ("c2", '{"a": 2}')], ""),  # the reasoning left out
        ("tool", "one", [], "c1"),
        ("tool", "two", [], "c2"),
        ("assistant", "Done.", [], ""),
    ]


@pytest.mark.parametrize(
    "kind", sorted(type_names(response_input_message_content_list_param.ResponseInputContentParam))
)
def test_every_content_part_type_is_honoured_or_refused_naming_it(kind):
    part = {"type": kind, "text": "Hi"} if kind == "input_text" else {"type": kind}
    result = outcome({"model": MODEL, "input": [{"role": "user", "content": [part]}]})
    if kind == "input_text":
        assert result[0].messages[0].content == "Hi"
    else:
        assert "text model" in assert_refused(result, "input[0].content[0].type")


@pytest.mark.parametrize("kind", sorted(type_names(tool_param.ToolParam)))
def test_every_tool_type_is_honoured_or_refused_naming_it(kind):
    result = outcome({"model": MODEL, "input": HI, "tools": [F, {**F, "type": kind, "name": "g"}]})
    if kind == "function":
        assert [t.name for t in result[0].tools] == ["f", "g"]
    else:
        assert repr(kind) in assert_refused(result, "tools[1].type")


FUNCTION_FIELDS = {
    "type": ("function", True),
    "name": ("f", True),
    "parameters": ({"type": "object"}, True),
    "description": ("It does f.", True),
    "strict": (True, False),  # the arguments are not constrained under auto; false passes
    "allowed_callers": (["programmatic"], False),
    "defer_loading": (True, False),
    "output_schema": ({"type": "string"}, False),
    "async": (True, False),
}


def test_every_function_tool_field_is_listed_here():
    published = set(typing.get_type_hints(function_tool_param.FunctionToolParam))
    assert published == set(FUNCTION_FIELDS)


@pytest.mark.parametrize("name", sorted(FUNCTION_FIELDS))
def test_each_function_tool_field_is_honoured_or_refused_naming_it(name):
    value, honoured = FUNCTION_FIELDS[name]
    result = outcome({"model": MODEL, "input": HI, "tools": [{**F, name: value}]})
    if honoured:
        assert isinstance(result, tuple), result.message
        tool = result[0].tools[0]
        assert {"description": tool.description, "parameters": json.loads(tool.parameters)}.get(
            name, value
        ) == value
    else:
        assert_refused(result, f"tools[0].{name}")


@pytest.mark.parametrize("effort", sorted(EFFORT_BUDGETS))
def test_each_reasoning_effort_is_a_thinking_budget(effort):
    request, response = outcome(_body("reasoning", {"effort": effort}))
    assert request.reasoning_budget == EFFORT_BUDGETS[effort]
    assert response["reasoning"]["effort"] == effort


def test_no_reasoning_effort_sets_no_budget():
    request, _ = outcome(_body("reasoning", {"effort": None}))
    assert not request.HasField("reasoning_budget")


def test_a_reasoning_effort_the_sdk_does_not_name_is_refused_naming_it():
    assert_refused(outcome(_body("reasoning", {"effort": "extreme"})), "reasoning.effort")


@pytest.mark.parametrize("name", sorted(set(reasoning.Reasoning.__annotations__) - {"effort"}))
def test_every_other_reasoning_option_is_refused_naming_it(name):
    value = {"mode": "pro"}.get(name, "auto")
    assert "leave it out" in assert_refused(
        outcome(_body("reasoning", {name: value})), f"reasoning.{name}"
    )
    assert isinstance(outcome(_body("reasoning", {name: None})), tuple)


@pytest.mark.parametrize(
    "kind",
    sorted(type_names(response_create_params.ToolChoice)),
)
def test_every_tool_choice_type_is_honoured_or_refused_naming_it(kind):
    choices = {
        "function": (
            {"type": "function", "name": "g"},
            lambda pb: (pb.tool_choice, pb.tool_choice_function) == (4, "g"),
        ),
        "allowed_tools": (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "g"}],
            },
            lambda pb: pb.tool_choice == 3 and [t.name for t in pb.tools] == ["g"],
        ),
    }
    choice, check = choices.get(kind, ({"type": kind}, None))
    result = outcome(
        {"model": MODEL, "input": HI, "tools": [F, {**F, "name": "g"}], "tool_choice": choice}
    )
    if check is not None:
        assert check(result[0]), result
    else:
        assert repr(kind) in assert_refused(result, "tool_choice")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [(None, 0), ("auto", 1), ("none", 2), ("required", 3)],
)
def test_the_tool_choice_options_reach_the_request(choice, expected):
    pb, response = outcome({"model": MODEL, "input": HI, "tools": [F], "tool_choice": choice})
    assert pb.tool_choice == expected and response["tool_choice"] == (choice or "auto")


def test_allowed_tools_naming_a_tool_not_given_is_refused():
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "h"}]}
    message = assert_refused(
        outcome({"model": MODEL, "input": HI, "tools": [F], "tool_choice": choice}), "tool_choice"
    )
    assert "'h'" in message


def test_parallel_tool_calls_false_is_refused_under_auto_with_tools():
    body = {"model": MODEL, "input": HI, "tools": [F], "parallel_tool_calls": False}
    assert_refused(outcome(body), "parallel_tool_calls")
    pb, _ = outcome({**body, "tool_choice": "required"})
    assert not pb.parallel_tool_calls
    pb, _ = outcome({**body, "parallel_tool_calls": True})
    assert pb.parallel_tool_calls


@pytest.mark.parametrize(
    "kind", sorted(type_names(response_format_text_config_param.ResponseFormatTextConfigParam))
)
def test_every_text_format_is_honoured(kind):
    form = {
        "type": kind,
        **({"name": "n", "schema": {"type": "object"}} if kind == "json_schema" else {}),
    }
    pb, response = outcome(_body("text", {"format": form}))
    constraint = pb.sampling.constraint
    assert {
        "text": not constraint.ListFields(),
        "json_object": constraint.json_object,
        "json_schema": json.loads(constraint.json_schema or "null") == {"type": "object"},
    }[kind]
    assert response["text"]["format"]["type"] == kind
