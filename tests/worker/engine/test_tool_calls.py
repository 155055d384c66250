"""Hermes-style tool calls parsed out of a reply's text: whole and in every split a stream
could make; malformed calls, unclosed calls and other formats stay text."""

from __future__ import annotations

import json

import pytest
from intentserve.worker.engine.tool_calls import ToolCallParser

WEATHER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "fmt": 24}}\n</tool_call>'


def parse_whole(text: str) -> tuple[str, list[tuple[str, dict]]]:
    parser = ToolCallParser()
    content, calls = parser.feed(text, final=True)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def parse_streamed(text: str, size: int) -> tuple[str, list[tuple[str, dict]]]:
    """`text` fed `size` characters at a time, then the end."""
    parser = ToolCallParser()
    content, calls = [], []
    for i in range(0, len(text), size):
        piece, new = parser.feed(text[i : i + size])
        content.append(piece)
        calls.extend(new)
    piece, new = parser.feed("", final=True)
    content.append(piece)
    calls.extend(new)
    assert parser.num_calls == len(calls)
    return "".join(content), [(c.name, json.loads(c.arguments)) for c in calls]


CASES = {
    "one call": (WEATHER, "", [("get_weather", {"city": "Paris"})]),
    "several calls": (
        f"{WEATHER}\n{TIME}\n",
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET", "fmt": 24})],
    ),
    "text around calls": (
        f"Let me look.\n{WEATHER}\n\nThen the time: {TIME} done",
        "Let me look.\nThen the time: done",
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET", "fmt": 24})],
    ),
    "no arguments": ('<tool_call>{"name": "ping"}</tool_call>', "", [("ping", {})]),
    "plain text": ("Paris is the capital < of France.", "Paris is the capital < of France.", []),
    "malformed json": (
        '<tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call> ok',
        '<tool_call>{"name": "get_weather", "arguments": {"city": }</tool_call> ok',
        [],
    ),
    "no name": (
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        [],
    ),
    "arguments not an object": (
        '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
        [],
    ),
    "unclosed at the end": (
        'Sure. <tool_call>{"name": "get_weather", "argu',
        'Sure. <tool_call>{"name": "get_weather", "argu',
        [],
    ),
    "a call after a malformed one": (
        f"<tool_call>nope</tool_call>{WEATHER}",
        "<tool_call>nope</tool_call>",
        [("get_weather", {"city": "Paris"})],
    ),
    "ends with a tag's beginning": ("a <tool_ca", "a <tool_ca", []),
}


@pytest.mark.parametrize("text, content, calls", CASES.values(), ids=CASES.keys())
def test_whole_text(text, content, calls):
    assert parse_whole(text) == (content, calls)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 11])
@pytest.mark.parametrize("text, content, calls", CASES.values(), ids=CASES.keys())
def test_streamed_in_pieces_gives_the_same(text, content, calls, size):
    assert parse_streamed(text, size) == (content, calls)


def test_text_that_may_begin_a_call_is_held_back_until_it_cannot():
    parser = ToolCallParser()
    assert parser.feed("Hi <tool") == ("Hi ", ())
    assert parser.feed("bar") == ("<toolbar", ())
    content, calls = parser.feed('<tool_call>{"name": "f"}')
    assert (content, calls) == ("", ())
    content, calls = parser.feed("</tool_call>")
    assert content == "" and [c.name for c in calls] == ["f"]


def test_each_call_has_its_own_id():
    _, calls = ToolCallParser().feed(WEATHER + WEATHER, final=True)
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
