"""The model's tool calls, parsed out of its text as it streams (the Hermes / Qwen format):

    Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

Each `<tool_call>...</tool_call>` whose body is a JSON object with a string `name` and an object
`arguments` becomes a ToolCall; everything else is the reply's text, unchanged: a call whose body
does not parse, or one still open when the reply ends, stays text (a model that writes calls in
another format replies with text). Whitespace right after a call (up to the next text, or the
end) is not text; the text before a call is kept as it streamed.

Parsing runs in the worker, on the text the stop strings left, so every front end (gRPC, HTTP)
gets the same calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call: its id, the tool's name and the arguments as JSON object text."""

    id: str
    name: str
    arguments: str


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str) -> ToolCall | None:
    """The call a `<tool_call>` body holds; None when it is not one."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), call["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_open(text: str) -> int:
    """How many of `text`'s last characters could begin `<tool_call>`."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


class ToolCallParser:
    """Feed it the reply's text as it grows; it returns the text that is no call, and the calls
    completed, holding back what could still become a call."""

    def __init__(self) -> None:
        self._pending = ""
        self._after_call = False  # whitespace right after a call is not text
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, tuple[ToolCall, ...]]:
        self._pending += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            start = self._pending.find(OPEN)
            end = -1 if start < 0 else self._pending.find(CLOSE, start + len(OPEN))
            if end < 0:
                keep = start if start >= 0 else len(self._pending) - _partial_open(self._pending)
                keep = len(self._pending) if final else keep
                content.append(self._text(self._pending[:keep]))
                self._pending = self._pending[keep:]
                break
            call = parse_call(self._pending[start + len(OPEN) : end])
            if call is None:
                content.append(self._text(self._pending[: end + len(CLOSE)]))
            else:
                content.append(self._text(self._pending[:start]))
                calls.append(call)
                self._after_call = True
            self._pending = self._pending[end + len(CLOSE) :]
        self.num_calls += len(calls)
        return "".join(content), tuple(calls)

    def _text(self, text: str) -> str:
        """`text` as reply text: after a call, whitespace up to the next text is dropped."""
        if not self._after_call:
            return text
        text = text.lstrip()
        self._after_call = not text
        return text
