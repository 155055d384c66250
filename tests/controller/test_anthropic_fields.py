"""No field of Anthropic's Messages and count_tokens request params is accepted and dropped: each
value that asks for something either reaches the GenerateRequest (or TokenizeRequest) the worker
gets, or is refused with 400 naming its path. The lists below are checked against the installed
official `anthropic` SDK's typed params: the bodies, each content block, tool and tool choice
type, so that a field the SDK can send and this table misses fails here."""

from __future__ import annotations

import json
import typing

import pytest
from anthropic.types import (
    CacheControlEphemeralParam,
    ContentBlockParam,
    MetadataParam,
    OutputConfigParam,
    TextBlockParam,
    ThinkingBlockParam,
    ThinkingConfigParam,
    ToolChoiceParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUnionParam,
    ToolUseBlockParam,
    message_count_tokens_params,
    message_create_params,
)
from intentserve.controller.router.http.anthropic_convert import (
    IS_ERROR_PREFIX,
    count_request_to_pb,
    messages_request_to_pb,
)
from intentserve.controller.router.http.anthropic_schema import (
    CountTokensRequest,
    MessagesRequest,
)
from intentserve.controller.router.http.errors import from_unsupported, from_validation
from intentserve.v1 import inference_pb2
from pydantic import ValidationError

MODEL = "smollm2-135m"
REFUSED = "refused"
HI = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def ok(pb) -> bool:
    return True


# Each top-level field: a value that asks for something, and what must happen to it (REFUSED:
# 400 naming the field; a path: 400 naming that path).
FIELDS = {
    "max_tokens": (7, lambda pb: pb.stop.max_tokens == 7),
    "messages": (HI, lambda pb: [(m.role, m.content) for m in pb.messages] == [("user", "Hi")]),
    "model": (MODEL, ok),  # the deployment's model; another is 404 (test_anthropic_messages)
    # A breakpoint asks for the prefix to be cached: the prefix cache caches every prefix.
    "cache_control": ({"type": "ephemeral"}, ok),
    "container": ({"id": "c1"}, REFUSED),
    "diagnostics": ({"previous_message_id": "msg_1"}, REFUSED),
    "inference_geo": ("us", REFUSED),
    "metadata": ({"user_id": "me"}, ok),  # a label for the client's own accounting
    "output_config": (
        {"format": {"type": "json_schema", "schema": {"type": "integer"}}},
        lambda pb: json.loads(pb.sampling.constraint.json_schema) == {"type": "integer"},
    ),
    "service_tier": ("standard_only", ok),  # one tier serves both values
    "speed": ("fast", REFUSED),
    "stop_sequences": (["x", "y"], lambda pb: list(pb.stop.stop) == ["x", "y"]),
    "stream": (True, ok),  # the reply's shape (test_anthropic_messages streams)
    "system": (
        "Be brief.",
        lambda pb: (pb.messages[0].role, pb.messages[0].content) == ("system", "Be brief."),
    ),
    "thinking": (
        {"type": "disabled"},
        lambda pb: dict(pb.chat_template_kwargs) == {"enable_thinking": False},
    ),
    "tool_choice": (
        {"type": "any"},
        lambda pb: pb.tool_choice == inference_pb2.TOOL_CHOICE_REQUIRED,
    ),
    "tools": (
        [WEATHER],
        lambda pb: (
            [(t.name, json.loads(t.parameters)) for t in pb.tools]
            == [("get_weather", WEATHER["input_schema"])]
        ),
    ),
    "user_profile_id": ("p1", ok),  # a label, as metadata.user_id
    "workspace_id": ("wrkspc_1", REFUSED),
    # Not in the SDK's typed params (sent as extra_body); Anthropic's API takes them.
    "temperature": (0.5, lambda pb: pb.sampling.temperature == 0.5),
    "top_p": (0.5, lambda pb: pb.sampling.top_p == 0.5),
    "top_k": (5, lambda pb: pb.sampling.top_k == 5),
}
# count_tokens' fields: what reaches the TokenizeRequest.
COUNT_FIELDS = {
    "messages": (HI, lambda pb: [m.content for m in pb.messages] == ["Hi"]),
    "model": (MODEL, ok),
    "cache_control": ({"type": "ephemeral"}, ok),
    # The format holds the reply to a schema; the prompt it is computed from is the same.
    "output_config": ({"format": {"type": "json_schema", "schema": {"type": "integer"}}}, ok),
    "speed": ("fast", REFUSED),
    "system": ("Be brief.", lambda pb: pb.messages[0].role == "system"),
    "thinking": (
        {"type": "disabled"},
        lambda pb: dict(pb.chat_template_kwargs) == {"enable_thinking": False},
    ),
    "tool_choice": ({"type": "none"}, lambda pb: not pb.tools),  # the template is not given them
    "tools": ([WEATHER], lambda pb: [t.name for t in pb.tools] == ["get_weather"]),
    "user_profile_id": ("p1", ok),
    "workspace_id": ("wrkspc_1", REFUSED),
}
# Values of honoured fields that ask for what is not done, and the path refused.
REFUSED_VALUES = [
    ("thinking", {"type": "enabled"}, "thinking.budget_tokens"),  # enabled needs a budget
    ("thinking", {"type": "adaptive", "budget_tokens": 8}, "thinking.budget_tokens"),
    ("thinking", {"type": "enabled", "budget_tokens": -1}, "thinking.budget_tokens"),
    ("thinking", {"type": "enabled", "budget_tokens": 16}, "thinking.budget_tokens"),  # max_tokens
    ("thinking", {"type": "between_tools"}, "thinking.type"),
    ("thinking", {"type": "adaptive", "display": "summarized"}, "thinking.display"),
    ("thinking", {"type": "sometimes"}, "thinking.type"),
    ("output_config", {"effort": "low"}, "output_config.effort"),
    ("cache_control", {"type": "ephemeral", "ttl": "1h"}, "cache_control.ttl"),
    (
        "tool_choice",
        {"type": "auto", "disable_parallel_tool_use": True},
        "tool_choice.disable_parallel_tool_use",
    ),
    ("tool_choice", {"type": "tool"}, "tool_choice.name"),
    ("tool_choice", {"type": "tool", "name": "nope"}, "tool_choice.name"),
    ("tool_choice", {"type": "always"}, "tool_choice.type"),
    ("top_p", 0, "top_p"),
    ("max_tokens", -1, "max_tokens"),
    ("metadata", {"user_id": "me", "tier": 1}, "metadata.tier"),
    ("mcp_servers", [{"type": "url", "url": "https://x", "name": "x"}], "mcp_servers"),  # beta
    ("frobnicate", 1, "frobnicate"),
    (
        "messages",
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The"}],
        "messages[1].role",
    ),
    ("system", [{"type": "image", "source": {}}], "system[0].type"),
    (
        "messages",
        [{"role": "user", "content": [{"type": {"text": 1}}]}],
        "messages[0].content[0].type",
    ),
    ("messages", [{"role": "user", "content": [{"text": "Hi"}]}], "messages[0].content[0].type"),
]
# Honoured values beyond FIELDS' one.
HONOURED_VALUES = [
    ("thinking", {"type": "adaptive"}, lambda pb: not pb.HasField("chat_template_kwargs")),
    ("thinking", {"type": "adaptive"}, lambda pb: not pb.HasField("reasoning_budget")),
    (
        "thinking",
        {"type": "enabled", "budget_tokens": 5},
        lambda pb: pb.reasoning_budget == 5 and not pb.HasField("chat_template_kwargs"),
    ),
    ("thinking", {"type": "adaptive", "display": "omitted"}, ok),  # blocks without their text
    ("output_config", {"effort": "high"}, ok),  # Anthropic's default: asks for nothing more
    ("tool_choice", {"type": "auto"}, lambda pb: pb.tool_choice == inference_pb2.TOOL_CHOICE_AUTO),
    ("tool_choice", {"type": "none"}, lambda pb: pb.tool_choice == inference_pb2.TOOL_CHOICE_NONE),
    (
        "tool_choice",
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        lambda pb: (
            (pb.tool_choice, pb.tool_choice_function, pb.parallel_tool_calls)
            == (inference_pb2.TOOL_CHOICE_FUNCTION, "get_weather", False)
        ),
    ),
    (
        "tool_choice",
        {"type": "any", "disable_parallel_tool_use": False},
        lambda pb: pb.parallel_tool_calls,
    ),
    ("service_tier", "auto", ok),
    ("speed", "standard", ok),
    (
        "system",
        [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        lambda pb: pb.messages[0].content == "A\nB",
    ),
    (
        "messages",
        [{"role": "system", "content": "S"}, *HI],
        lambda pb: [m.role for m in pb.messages] == ["system", "user"],
    ),
]

TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
# Each block field of the SDK's: a value, and what must happen to it. A block is sent where its
# turn takes it (BLOCK_PLACES).
BLOCK_FIELDS = {
    "text": {
        "type": ("text", ok),
        "text": ("Hi there", lambda pb: pb.messages[0].content == "Hi there"),
        "cache_control": ({"type": "ephemeral"}, ok),
        "citations": (
            [
                {
                    "type": "char_location",
                    "cited_text": "x",
                    "document_index": 0,
                    "start_char_index": 0,
                    "end_char_index": 1,
                }
            ],
            REFUSED,
        ),
    },
    "tool_use": {
        "type": ("tool_use", ok),
        "id": ("toolu_9", lambda pb: pb.messages[1].tool_calls[0].id == "toolu_9"),
        "name": ("get_time", lambda pb: pb.messages[1].tool_calls[0].name == "get_time"),
        "input": (
            {"city": "Rome"},
            lambda pb: json.loads(pb.messages[1].tool_calls[0].arguments) == {"city": "Rome"},
        ),
        "cache_control": ({"type": "ephemeral"}, ok),
        "caller": ({"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}, REFUSED),
        "toolset_name": ("mine", REFUSED),
    },
    "tool_result": {
        "type": ("tool_result", ok),
        "tool_use_id": ("toolu_1", lambda pb: pb.messages[2].tool_call_id == "toolu_1"),
        "content": (
            [{"type": "text", "text": "9 C"}, {"type": "text", "text": "rain"}],
            lambda pb: pb.messages[2].content == "9 C\nrain",
        ),
        "is_error": (True, lambda pb: pb.messages[2].content == IS_ERROR_PREFIX + "no such city"),
        "cache_control": ({"type": "ephemeral"}, ok),
        "toolset_name": ("mine", REFUSED),
    },
    "thinking": {
        "type": ("thinking", ok),
        # Left out of the prompt, as Anthropic leaves earlier turns' thinking out.
        "thinking": (
            "let me see",
            lambda pb: all("let me see" not in m.content for m in pb.messages),
        ),
        "signature": ("abc", ok),
    },
}
BLOCK_EXAMPLES = {
    "text": {"type": "text", "text": "Hi"},
    "tool_use": TOOL_USE,
    "tool_result": {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city"},
    "thinking": {"type": "thinking", "thinking": "hmm", "signature": "s"},
}
BLOCK_PARAMS = {
    "text": TextBlockParam,
    "tool_use": ToolUseBlockParam,
    "tool_result": ToolResultBlockParam,
    "thinking": ThinkingBlockParam,
}
# Which turn takes each block type here; any other (turn, type) is refused naming its type.
HONOURED_BLOCKS = {
    ("user", "text"),
    ("user", "tool_result"),
    ("assistant", "text"),
    ("assistant", "tool_use"),
    ("assistant", "thinking"),
}
TOOL_FIELDS = {
    "name": ("get_time", lambda pb: pb.tools[0].name == "get_time"),
    "input_schema": (
        {"type": "object"},
        lambda pb: json.loads(pb.tools[0].parameters) == {"type": "object"},
    ),
    "description": ("Tells the time", lambda pb: pb.tools[0].description == "Tells the time"),
    "type": ("custom", ok),
    "cache_control": ({"type": "ephemeral"}, ok),
    "strict": (True, REFUSED),
    "allowed_callers": (["code_execution_20250825"], REFUSED),
    "defer_loading": (True, REFUSED),
    "eager_input_streaming": (True, REFUSED),
    "input_examples": ([{"city": "Paris"}], REFUSED),
}


def _fields(typed_dict) -> set[str]:
    return set(typing.get_type_hints(typed_dict))


def _literals(hint) -> tuple[str, ...]:
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return tuple(v for arg in typing.get_args(hint) for v in _literals(arg))


def _type_literals(union) -> set[str]:
    """The `type` literal of each member of an SDK union."""
    return {
        v
        for member in typing.get_args(union)
        for v in _literals(typing.get_type_hints(member)["type"])
    }


def _outcome(schema, body: dict):
    """The worker's request, or the refusal (an OpenAIError)."""
    try:
        request = schema.model_validate(body)
    except ValidationError as error:
        return from_validation(error)
    unsupported = request.unsupported()
    if unsupported is not None:
        return from_unsupported(unsupported)
    to_pb = messages_request_to_pb if schema is MessagesRequest else count_request_to_pb
    return to_pb(request)[0]


def _body(name: str, value, schema=MessagesRequest) -> dict:
    body = {"model": MODEL, "messages": HI}
    if schema is MessagesRequest:
        body["max_tokens"] = 16
    if name.startswith("tool_choice"):
        body["tools"] = [WEATHER]
    return body | {name: value}


def _check(outcome, expected, path: str) -> None:
    if expected == REFUSED:
        assert not hasattr(outcome, "messages"), f"{path} was accepted"
        assert (outcome.status, outcome.param) == (400, path), outcome.message
        assert outcome.message.startswith(f"{path}: ")
    else:
        assert hasattr(outcome, "messages"), f"{path} was refused: {outcome.message}"
        assert expected(outcome), f"{path} did not reach the worker's request"


def test_every_published_field_is_listed_here():
    create = _fields(message_create_params.MessageCreateParamsBase) | {"stream"}
    assert create == set(FIELDS) - {"temperature", "top_p", "top_k"}
    assert _fields(message_count_tokens_params.MessageCountTokensParams) == set(COUNT_FIELDS)
    for kind, params in BLOCK_PARAMS.items():
        assert _fields(params) == set(BLOCK_FIELDS[kind]), kind
    assert _fields(ToolParam) == set(TOOL_FIELDS)
    assert _fields(MetadataParam) == {"user_id"}
    assert _fields(CacheControlEphemeralParam) == {"type", "ttl"}
    assert _fields(OutputConfigParam) == {"effort", "format"}
    thinking = set().union(*map(_fields, typing.get_args(ThinkingConfigParam)))
    assert thinking == {"type", "budget_tokens", "display"}
    choices = set().union(*map(_fields, typing.get_args(ToolChoiceParam)))
    assert choices == {"type", "name", "disable_parallel_tool_use"}


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_is_honoured_or_refused_naming_it(name):
    value, expected = FIELDS[name]
    _check(_outcome(MessagesRequest, _body(name, value)), expected, name)


@pytest.mark.parametrize("name", COUNT_FIELDS)
def test_each_count_tokens_field_is_honoured_or_refused_naming_it(name):
    value, expected = COUNT_FIELDS[name]
    body = _body(name, value, CountTokensRequest)
    _check(_outcome(CountTokensRequest, body), expected, name)


@pytest.mark.parametrize(("name", "value", "path"), REFUSED_VALUES)
def test_a_value_that_asks_for_what_is_not_done_is_refused_naming_its_path(name, value, path):
    _check(_outcome(MessagesRequest, _body(name, value)), REFUSED, path)


@pytest.mark.parametrize(("name", "value", "expected"), HONOURED_VALUES)
def test_other_honoured_values_reach_the_request(name, value, expected):
    _check(_outcome(MessagesRequest, _body(name, value)), expected, name)


def _placed(block: dict) -> tuple[list[dict], str]:
    """A conversation holding `block` where its turn takes it, and the block's path."""
    kind = block["type"]
    if kind in ("tool_use", "thinking"):
        turns = [
            *HI,
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "Go on"},
        ]
        return turns, "messages[1].content[0]"
    if kind == "tool_result":
        called = {"role": "assistant", "content": [TOOL_USE]}
        return [*HI, called, {"role": "user", "content": [block]}], "messages[2].content[0]"
    return [{"role": "user", "content": [block]}], "messages[0].content[0]"


@pytest.mark.parametrize(
    ("kind", "name"), [(k, n) for k, fields in BLOCK_FIELDS.items() for n in fields]
)
def test_each_block_field_is_honoured_or_refused_naming_its_path(kind, name):
    value, expected = BLOCK_FIELDS[kind][name]
    turns, path = _placed(BLOCK_EXAMPLES[kind] | {name: value})
    body = {"model": MODEL, "max_tokens": 16, "messages": turns}
    _check(_outcome(MessagesRequest, body), expected, f"{path}.{name}")


@pytest.mark.parametrize("kind", sorted(_type_literals(ContentBlockParam)))
@pytest.mark.parametrize("role", ["user", "assistant"])
def test_each_block_type_is_read_or_refused_naming_its_type(role, kind):
    block = BLOCK_EXAMPLES.get(kind, {"type": kind})
    if role == "user":
        turns, path = [{"role": "user", "content": [block]}], "messages[0].content[0]"
    else:
        turns = [
            *HI,
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "Go on"},
        ]
        path = "messages[1].content[0]"
    outcome = _outcome(MessagesRequest, {"model": MODEL, "max_tokens": 16, "messages": turns})
    if (role, kind) in HONOURED_BLOCKS:
        assert hasattr(outcome, "messages"), outcome.message
    else:
        _check(outcome, REFUSED, f"{path}.type")
        assert "allowed: " in outcome.message


def test_an_image_is_refused_by_name_as_the_model_has_no_vision():
    image = {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}
    for turns, path in (
        ([{"role": "user", "content": [image]}], "messages[0].content[0].type"),
        (
            [
                *HI,
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
                    ],
                },
            ],
            "messages[2].content[0].content[0].type",
        ),
    ):
        outcome = _outcome(MessagesRequest, {"model": MODEL, "max_tokens": 16, "messages": turns})
        _check(outcome, REFUSED, path)
        assert "image blocks are not read" in outcome.message and "no vision" in outcome.message


@pytest.mark.parametrize("kind", sorted(_type_literals(ToolUnionParam)))
def test_each_tool_type_is_honoured_or_refused_naming_it(kind):
    tool = WEATHER | {"type": kind}
    outcome = _outcome(MessagesRequest, _body("tools", [tool]))
    if kind == "custom":
        assert [t.name for t in outcome.tools] == ["get_weather"]
    else:
        _check(outcome, REFUSED, "tools[0].type")
        assert "server tools" in outcome.message


@pytest.mark.parametrize("name", TOOL_FIELDS)
def test_each_tool_field_is_honoured_or_refused_naming_it(name):
    value, expected = TOOL_FIELDS[name]
    _check(
        _outcome(MessagesRequest, _body("tools", [WEATHER | {name: value}])),
        expected,
        f"tools[0].{name}",
    )


@pytest.mark.parametrize("kind", sorted(_type_literals(ToolChoiceParam)))
def test_every_tool_choice_type_is_honoured(kind):
    choice = {"type": kind} | ({"name": "get_weather"} if kind == "tool" else {})
    outcome = _outcome(MessagesRequest, _body("tool_choice", choice))
    assert hasattr(outcome, "messages"), outcome.message
    assert outcome.tool_choice != inference_pb2.TOOL_CHOICE_UNSPECIFIED


def test_a_tool_round_trip_becomes_chats_turns():
    """tool_use blocks are the assistant turn's calls with their ids; each tool_result is a tool
    turn naming its call, before the user's text that follows it."""
    second = {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}
    turns = [
        *HI,
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, TOOL_USE, second]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "9 C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "boom",
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    pb = _outcome(
        MessagesRequest, {"model": MODEL, "max_tokens": 16, "messages": turns, "tools": [WEATHER]}
    )
    assert [(m.role, m.content, m.tool_call_id) for m in pb.messages] == [
        ("user", "Hi", ""),
        ("assistant", "Looking.", ""),
        ("tool", "9 C", "toolu_1"),
        ("tool", IS_ERROR_PREFIX + "boom", "toolu_2"),
        ("user", "Thanks", ""),
    ]
    calls = [(c.id, c.name, json.loads(c.arguments)) for c in pb.messages[1].tool_calls]
    assert calls == [
        ("toolu_1", "get_weather", {"city": "Paris"}),
        ("toolu_2", "get_weather", {"city": "Rome"}),
    ]
    assert pb.parallel_tool_calls and pb.tool_choice == inference_pb2.TOOL_CHOICE_UNSPECIFIED


@pytest.mark.parametrize(
    ("worker_field", "param"),
    [
        ("messages[0].content", "system"),
        ("messages[2].content", "messages[1]"),
        ("messages[3].content", "messages[2].content[0]"),
        ("tools[0].parameters", "tools[0].input_schema"),
        ("stop.max_tokens", "max_tokens"),
        ("stop.stop", "stop_sequences"),
        ("sampling.temperature", "temperature"),
        ("sampling.constraint.json_schema", "output_config.format"),
        ("tool_choice_function", "tool_choice.name"),
        ("chat_template_kwargs", "thinking"),
    ],
)
def test_the_workers_field_paths_name_the_bodys(worker_field, param):
    turns = [
        *HI,
        {"role": "assistant", "content": [TOOL_USE]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "9 C"}],
        },
    ]
    body = MessagesRequest.model_validate(
        {"model": MODEL, "max_tokens": 16, "system": "S", "messages": turns, "tools": [WEATHER]}
    )
    assert body.unsupported() is None
    _, names = messages_request_to_pb(body)
    assert names(worker_field) == param
