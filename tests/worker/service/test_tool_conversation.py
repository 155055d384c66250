"""Tools, assistant turns with tool calls and tool turns (GenerateRequest.tools, tool_choice,
messages[].tool_calls / tool_call_id) through the worker's conversion into the chat template, in
the shape Hugging Face's templates read; what is wrong with them is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from intentserve.v1 import inference_pb2
from intentserve.worker.engine.constraint import ConstraintKind
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.model.tokenizer import Tokenizer
from intentserve.worker.service import convert

from tests.worker.model.tiny_checkpoints import tiny_tokenizer

HERMES = (Path(__file__).parents[2] / "data" / "hermes_tools.jinja").read_text()
NO_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
WEATHER = inference_pb2.Tool(
    name="get_weather",
    description="The weather in a city",
    parameters='{"type": "object", "properties": {"city": {"type": "string"}}}',
)
CALL = inference_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
ROUND_TRIP = [
    inference_pb2.ChatMessage(role="user", content="Weather in Paris?"),
    inference_pb2.ChatMessage(role="assistant", tool_calls=[CALL]),
    inference_pb2.ChatMessage(role="tool", content="18 C", tool_call_id="call_1"),
]


class Recording:
    """A tokenizer whose template records what it was given."""

    chat_template = "(recording)"

    def __init__(self, reads_tools: bool = True) -> None:
        self.reads_tools = reads_tools
        self.given: dict = {}

    def template_reads(self, variable: str) -> bool:
        return variable == "tools" and self.reads_tools

    def apply_chat_template(self, messages, **extra):
        self.given = {"messages": messages, **extra}
        return "prompt"

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 100 for c in text]

    def min_num_tokens(self, utf8: bytes) -> int:
        return 0  # no cheap bound


def engine(tokenizer) -> Engine:
    runner = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=100)))
    return Engine(
        tokenizer=tokenizer,
        scheduler=None,
        runner=runner,
        realized=None,
        grammars=GrammarCompiler(tokenizer),
        max_model_len=4096,
    )


def prepare(tokenizer, **fields):
    fields.setdefault("stop", inference_pb2.StopConditions(max_tokens=4))
    call = convert.generate_request_from_pb(inference_pb2.GenerateRequest(**fields))
    with convert.proto_field_names():
        return engine(tokenizer).prepare(call.prompt, call.params, call.request_id)


def test_tools_calls_and_results_reach_the_template_in_hugging_faces_shape():
    tokenizer = Recording()
    prepared = prepare(tokenizer, messages=ROUND_TRIP, tools=[WEATHER])
    assert prepared.parses_tool_calls
    assert tokenizer.given["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert tokenizer.given["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    ]


def test_a_real_template_renders_the_tools_the_call_and_its_result():
    tokenizer = Tokenizer(
        tiny_tokenizer(),
        bos_token_id=None,
        eos_token_ids=[2],
        add_bos_token=False,
        chat_template=HERMES,
    )
    call = convert.generate_request_from_pb(
        inference_pb2.GenerateRequest(messages=ROUND_TRIP, tools=[WEATHER])
    )
    prompt = call.prompt.render(tokenizer)
    tool_line = prompt.split("<tools>\n")[1].split("\n")[0]
    assert json.loads(tool_line)["function"]["name"] == "get_weather"
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    assert "<tool_response>\n18 C\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tool_choice_none_gives_the_template_no_tools_and_parses_nothing():
    tokenizer = Recording()
    prepared = prepare(
        tokenizer,
        messages=ROUND_TRIP,
        tools=[WEATHER],
        tool_choice=inference_pb2.TOOL_CHOICE_NONE,
    )
    assert "tools" not in tokenizer.given and not prepared.parses_tool_calls


@pytest.mark.parametrize(
    ("choice", "function", "names"),
    [
        (inference_pb2.TOOL_CHOICE_REQUIRED, "", ["get_time", "get_weather"]),
        (inference_pb2.TOOL_CHOICE_FUNCTION, "get_time", ["get_time"]),
    ],
    ids=["required", "named"],
)
def test_a_required_or_named_call_constrains_the_reply_to_one_call(choice, function, names):
    """The reply is held to one call of the allowed tools by the grammar engine (a TOOL_CALL
    constraint), the template is given every tool, and the reply's call is parsed."""
    clock = inference_pb2.Tool(name="get_time", parameters='{"type": "object"}')
    tokenizer = Recording()
    call = convert.generate_request_from_pb(
        inference_pb2.GenerateRequest(
            messages=ROUND_TRIP[:1],
            tools=[WEATHER, clock],
            tool_choice=choice,
            tool_choice_function=function,
        )
    )
    constraint = call.params.constraint
    assert constraint.kind is ConstraintKind.TOOL_CALL
    schema = json.loads(constraint.text)
    calls = schema.get("anyOf", [schema])
    assert [c["properties"]["name"]["const"] for c in calls] == names
    call.prompt.render(tokenizer)
    assert len(tokenizer.given["tools"]) == 2 and call.prompt.parses_tool_calls


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (
            {"tool_choice": inference_pb2.TOOL_CHOICE_FUNCTION, "tool_choice_function": "nope"},
            "tool_choice",
        ),
        ({"tool_choice": inference_pb2.TOOL_CHOICE_FUNCTION}, "tool_choice_function"),
        (
            {"tool_choice": inference_pb2.TOOL_CHOICE_AUTO, "tool_choice_function": "get_weather"},
            "tool_choice_function",
        ),
        (
            {
                "tool_choice": inference_pb2.TOOL_CHOICE_REQUIRED,
                "sampling": inference_pb2.SamplingParams(
                    constraint=inference_pb2.OutputConstraint(regex="a+")
                ),
            },
            "tool_choice",
        ),
    ],
    ids=["unknown-function", "no-function", "function-without-named-choice", "with-a-constraint"],
)
def test_a_call_that_cannot_be_enforced_is_refused_naming_the_field(fields, field):
    with pytest.raises(InvalidRequestError) as info, convert.proto_field_names():
        convert.generate_request_from_pb(
            inference_pb2.GenerateRequest(messages=ROUND_TRIP[:1], tools=[WEATHER], **fields)
        )
    assert info.value.field == field


def test_without_tools_nothing_is_parsed():
    assert not prepare(Recording(), messages=ROUND_TRIP).parses_tool_calls


def test_a_template_that_never_reads_tools_is_refused_naming_tools():
    real = Tokenizer(
        tiny_tokenizer(),
        bos_token_id=None,
        eos_token_ids=[2],
        add_bos_token=False,
        chat_template=NO_TOOLS,
    )
    assert not real.template_reads("tools")
    with pytest.raises(InvalidRequestError, match="never reads `tools`") as info:
        prepare(real, messages=ROUND_TRIP, tools=[WEATHER])
    assert info.value.field == "tools"


def _message(**fields) -> inference_pb2.ChatMessage:
    return inference_pb2.ChatMessage(**fields)


@pytest.mark.parametrize(
    ("fields", "field_path"),
    [
        (
            {
                "messages": [
                    _message(
                        role="assistant",
                        tool_calls=[
                            inference_pb2.ToolCall(id="c", name="f", arguments="{not json")
                        ],
                    )
                ],
                "tools": [WEATHER],
            },
            "messages[0].tool_calls[0].arguments",
        ),
        (
            {
                "messages": [
                    _message(
                        role="assistant",
                        tool_calls=[inference_pb2.ToolCall(id="c", name="f", arguments="[1]")],
                    )
                ]
            },
            "messages[0].tool_calls[0].arguments",
        ),
        ({"messages": [_message(role="user", tool_calls=[CALL])]}, "messages[0].tool_calls"),
        ({"messages": [_message(role="tool", content="18 C")]}, "messages[0].tool_call_id"),
        (
            {"messages": [_message(role="user", content="x", tool_call_id="c")]},
            "messages[0].tool_call_id",
        ),
        (
            {"messages": ROUND_TRIP, "tools": [inference_pb2.Tool(name="f", parameters="[]")]},
            "tools[0].parameters",
        ),
        ({"messages": ROUND_TRIP, "tools": [inference_pb2.Tool()]}, "tools[0].name"),
        ({"messages": ROUND_TRIP, "tool_choice": 7}, "tool_choice"),
        ({"prompt": "Hi", "tools": [WEATHER]}, "tools"),
        ({"prompt": "Hi", "tool_choice": inference_pb2.TOOL_CHOICE_NONE}, "tool_choice"),
        (
            {"messages": ROUND_TRIP, "chat_template_kwargs": {"tools": []}},
            "chat_template_kwargs",
        ),
    ],
)
def test_what_is_wrong_is_refused_naming_its_field(fields, field_path):
    with pytest.raises(InvalidRequestError) as info:
        prepare(Recording(), **fields)
    assert info.value.field == field_path
