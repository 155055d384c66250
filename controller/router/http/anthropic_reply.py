"""`GenerateResponse`s -> Anthropic's Message object and its stream of server-sent events.

One `MessageReply` takes a call's responses in order; each `add` returns the stream's events
for what came, and `message()` is the whole reply (`stream: false`) from the same blocks:

    message_start                              (the message, empty; usage as known so far)
    content_block_start / _delta / _stop       per block, in order: thinking (thinking_delta,
                                               then signature_delta), text (text_delta),
                                               tool_use (its input as one input_json_delta)
    message_delta                              stop_reason, stop_sequence, usage
    message_stop

A thinking block's `signature` is the SHA-256 of its whole thinking text, in hex: the SDK's
ThinkingBlock needs one, and it lets a client see the text is whole. It is not keyed (nothing
secret signs it); thinking blocks sent back are left out of the prompt whatever they hold.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from intentserve.controller.router.http.errors import OpenAIError
from intentserve.v1 import inference_pb2

STOP_REASONS = {
    inference_pb2.FINISH_REASON_STOP: "end_turn",
    inference_pb2.FINISH_REASON_LENGTH: "max_tokens",
    inference_pb2.FINISH_REASON_TOOL_CALLS: "tool_use",
}
THOUGHT_WHEN_DISABLED = (
    "thinking: the model thought, though thinking is disabled (its chat template does not read "
    "enable_thinking); allowed on this model: {'type': 'adaptive'}, or leave thinking out"
)
Event = dict[str, Any]


def signature(thinking: str) -> str:
    return hashlib.sha256(thinking.encode()).hexdigest()


def sse(event: Event) -> str:
    """One event as server-sent events write it: its type on the `event:` line."""
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n"


@dataclass
class MessageReply:
    model: str
    request_id: str
    show_thinking: bool = True  # false: thinking: {display: omitted}, blocks without their text
    thinking_disabled: bool = False  # thinking: disabled: reasoning that comes is an error
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    stop_sequence: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    _open: str | None = None  # the type of the last block while it is open
    _thought: list[str] = field(default_factory=list)  # the open thinking block's whole text

    @property
    def id(self) -> str:
        return f"msg_{self.request_id}"

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }

    def start(self) -> Event:
        return {"type": "message_start", "message": {**self.message(), "content": []}}

    def add(self, response: inference_pb2.GenerateResponse) -> list[Event]:
        """Take one response in; the events it makes."""
        events: list[Event] = []
        if response.reasoning:
            if self.thinking_disabled:
                raise OpenAIError(400, THOUGHT_WHEN_DISABLED, param="thinking")
            events += self._extend("thinking", response.reasoning)
        if response.text:
            events += self._extend("text", response.text)
        for call in response.tool_calls:
            events += self._close()
            index = len(self.content)
            block = {"type": "tool_use", "id": call.id, "name": call.name}
            self.content.append({**block, "input": json.loads(call.arguments or "{}")})
            delta = {"type": "input_json_delta", "partial_json": call.arguments or "{}"}
            events += [
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                },
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_stop", "index": index},
            ]
        self.output_tokens = response.num_output_tokens
        if response.finish_reason:
            events += self._finish(response)
        return events

    def _finish(self, response: inference_pb2.GenerateResponse) -> list[Event]:
        if response.finish_reason not in STOP_REASONS:  # aborted by its worker
            raise OpenAIError(503, "the worker aborted the request before it ended", code="aborted")
        self.stop_reason = STOP_REASONS[response.finish_reason]
        if response.stop_string:  # one of stop_sequences ended it
            self.stop_reason, self.stop_sequence = "stop_sequence", response.stop_string
        self.input_tokens = response.num_prompt_tokens
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        return [
            *self._close(),
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def _extend(self, kind: str, text: str) -> list[Event]:
        """`text` onto the open block of `kind` (thinking or text), opened first if need be."""
        events: list[Event] = []
        if self._open != kind:
            events += self._close()
            empty = {"type": "text", "text": ""}
            if kind == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
            self.content.append(dict(empty))
            self._open = kind
            events.append(
                {
                    "type": "content_block_start",
                    "index": len(self.content) - 1,
                    "content_block": empty,
                }
            )
        if kind == "thinking":
            self._thought.append(text)
            if not self.show_thinking:
                return events
        self.content[-1][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        events.append(
            {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}
        )
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        index, events = len(self.content) - 1, []
        if self._open == "thinking":
            signed = signature("".join(self._thought))
            self.content[-1]["signature"], self._thought = signed, []
            delta = {"type": "signature_delta", "signature": signed}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        self._open = None
        return [*events, {"type": "content_block_stop", "index": index}]
