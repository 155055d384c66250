"""Parallel tool calls: with tool_choice required (or a named function) and parallel_tool_calls,
the grammar admits one or more calls, a line apart, and the parser returns each; without it,
exactly one. Real model (SmolLM2, float32, greedy) given tests/data/hermes_tools.jinja."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import ChatMessage, Conversation, Tool, ToolChoice
from intentserve.worker.engine.constraint import ConstraintKind
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall
from intentserve.worker.sched.sequence import FinishReason

pytestmark = pytest.mark.model

TEMPLATE = (Path(__file__).parents[2] / "data" / "hermes_tools.jinja").read_text()
WEATHER = Tool(
    "get_weather",
    "The current weather in a city",
    json.dumps(
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        }
    ),
)
GREEDY = SamplingParams(max_tokens=80, temperature=0)


def _called(*cities: str) -> ChatMessage:
    calls = tuple(
        ToolCall(f"call_{city}", "get_weather", json.dumps({"city": city})) for city in cities
    )
    return ChatMessage("assistant", "", calls)


def _conversation(parallel: bool) -> Conversation:
    """Two cities asked about, each time answered with two calls; then two more cities."""
    return Conversation(
        (
            ChatMessage("user", "What is the weather in Paris and in Rome?"),
            _called("Paris", "Rome"),
            ChatMessage("user", "What is the weather in Oslo and in Lima?"),
            _called("Oslo", "Lima"),
            ChatMessage("user", "What is the weather in Berlin and in Madrid?"),
        ),
        tools=(WEATHER,),
        tool_choice=ToolChoice.REQUIRED,
        parallel_tool_calls=parallel,
    )


@pytest.fixture(scope="module")
def eng(smollm2_fp32):
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=64 << 20)
        .scheduler(max_model_len=1024, max_num_seqs=4)
        .chat_template(TEMPLATE)
        .build(loaded=smollm2_fp32)
    )


def _reply(eng, parallel: bool):
    conversation = _conversation(parallel)
    constraint = conversation.tool_call_constraint()
    params = dataclasses.replace(GREEDY, constraint=constraint)
    (out,) = eng.generate([conversation], params)
    return constraint, out


def test_with_parallel_tool_calls_the_grammar_admits_two_calls_and_both_are_parsed(eng):
    constraint, out = _reply(eng, True)
    assert constraint.kind is ConstraintKind.TOOL_CALLS
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Berlin"}),
        ("get_weather", {"city": "Madrid"}),
    ], out.new_text
    assert out.finish_reason is FinishReason.TOOL_CALLS
    assert out.new_text == ""


def test_without_parallel_tool_calls_the_reply_is_one_call(eng):
    constraint, out = _reply(eng, False)
    assert constraint.kind is ConstraintKind.TOOL_CALL
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Berlin"})
    ], out.new_text
    assert out.finish_reason is FinishReason.TOOL_CALLS
