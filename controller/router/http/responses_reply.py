"""`GenerateResponse`s -> OpenAI's Response object and its stream of events.

One `ResponseReply` takes a request's responses in order and builds the `output` items as they
come: a `reasoning` item for the thinking text (GenerateResponse.reasoning), a `message` with
one `output_text` part for the reply, a `function_call` item for each call the worker parsed.
Each step returns the events it makes, numbered by `sequence_number`, in the order OpenAI
documents:

    response.created, response.in_progress
    each item: response.output_item.added
        message:       response.content_part.added, response.output_text.delta...,
                       response.output_text.done, response.content_part.done
        reasoning:     the same, with response.reasoning_text.delta... and .done
        function_call: response.function_call_arguments.delta, .function_call_arguments.done
      response.output_item.done
    response.completed, or response.incomplete (max_output_tokens or the model length ended it)

The reply without `stream` is the last event's Response.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from intentserve.controller.router.http.openai_chat_schema import (
    ChatMessage,
    FunctionCall,
    ToolCallParam,
)
from intentserve.controller.router.http.responses_schema import ResponsesRequest
from intentserve.v1 import inference_pb2

Event = dict[str, Any]
Item = dict[str, Any]
# A text item's content part, and its events' prefix.
PARTS = {"message": "output_text", "reasoning": "reasoning_text"}
ID_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
ENDED = {
    inference_pb2.FINISH_REASON_STOP: "completed",
    inference_pb2.FINISH_REASON_TOOL_CALLS: "completed",
    inference_pb2.FINISH_REASON_LENGTH: "incomplete",
    inference_pb2.FINISH_REASON_ABORT: "incomplete",
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseReply:
    body: ResponsesRequest
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"  # then completed, incomplete or failed
    completed_at: int | None = None
    incomplete_reason: str | None = None
    error: dict[str, str] | None = None
    output: list[Item] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_reasoning_tokens: int = 0  # of num_output_tokens, a thinking model's thinking
    _open: Item | None = None  # the message or reasoning item taking text
    _open_text: list[str] = field(default_factory=list)
    _num_events: int = 0

    def start(self) -> list[Event]:
        response = self.response()
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def add(self, response: inference_pb2.GenerateResponse) -> list[Event]:
        """One response's reasoning, text and calls, as output items and their events."""
        events = []
        if response.reasoning:
            events += self._text("reasoning", response.reasoning)
        if response.text:
            events += self._text("message", response.text)
        for call in response.tool_calls:
            events += self._close()
            events += self._call(call)
        self.num_output_tokens = response.num_output_tokens
        self.num_reasoning_tokens = response.num_reasoning_tokens
        ended = ENDED.get(response.finish_reason)
        if ended is not None:
            self.status, self.num_prompt_tokens = ended, response.num_prompt_tokens
            self.completed_at = int(time.time()) if ended == "completed" else None
            if response.finish_reason == inference_pb2.FINISH_REASON_LENGTH:
                self.incomplete_reason = "max_output_tokens"
        return events

    def finish(self) -> list[Event]:
        """The open item closed (a reply of nothing is one empty message), then
        response.completed or response.incomplete."""
        events = [] if self.output else self._text("message", "")
        events += self._close()
        if self.status == "in_progress":  # NOTE: the call ended without its last response
            self.status = "incomplete"
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=self.response())]

    def failed(self, error: dict[str, Any]) -> list[Event]:
        """After an error inside the stream (OpenAI's error body): the error event, then
        response.failed."""
        self.status = "failed"
        code, message = error.get("code") or "server_error", error["message"]
        self.error = {"code": code, "message": message}
        event = self._event("error", code=code, message=message, param=error.get("param"))
        return [event, self._event("response.failed", response=self.response())]

    def assistant_turn(self) -> ChatMessage:
        """The output as the next request's assistant turn (the reasoning left out)."""
        text = "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )
        calls = [
            ToolCallParam(
                id=item["call_id"],
                function=FunctionCall(name=item["name"], arguments=item["arguments"]),
            )
            for item in self.output
            if item["type"] == "function_call"
        ]
        if calls:
            return ChatMessage(role="assistant", content=text or None, tool_calls=calls)
        return ChatMessage(role="assistant", content=text)

    def response(self) -> dict[str, Any]:
        body, done = self.body, self.status in ("completed", "incomplete")
        text_format = body.text_format
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.status == "incomplete" else None
            ),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": body.model,
            "output": [dict(item) for item in self.output] if done else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": body.reasoning and body.reasoning.effort, "summary": None},
            "store": body.stores,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {
                "format": {"type": "text"}
                if text_format is None
                else text_format.model_dump(by_alias=True, exclude_none=True)
            },
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
            "tools": [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": False,
                }
                for tool in body.function_tools
            ],
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": "disabled",
            "usage": self.usage() if done else None,
            "user": body.user,
            "safety_identifier": body.safety_identifier,
            "metadata": body.metadata or {},
            "service_tier": "default",
            "background": False,
        }

    def usage(self) -> dict[str, Any]:
        # NOTE: the worker does not count cached prompt tokens apart: 0.
        return {
            "input_tokens": self.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.num_reasoning_tokens},
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
        }

    def _event(self, kind: str, **fields: Any) -> Event:
        self._num_events += 1
        return {"type": kind, "sequence_number": self._num_events - 1, **fields}

    def _added(self, item: Item) -> Event:
        self.output.append(item)
        return self._event(
            "response.output_item.added", output_index=len(self.output) - 1, item=dict(item)
        )

    def _call(self, call: inference_pb2.ToolCall) -> list[Event]:
        item = {
            "id": new_id(ID_PREFIXES["function_call"]),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        events = [self._added(item)]
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        # NOTE: the worker sends each call whole, parsed: its arguments are one delta.
        delta = self._event("response.function_call_arguments.delta", **where, delta=call.arguments)
        item.update(arguments=call.arguments, status="completed")
        done = self._event(
            "response.function_call_arguments.done",
            **where,
            name=call.name,
            arguments=call.arguments,
        )
        return [
            *events,
            delta,
            done,
            self._event("response.output_item.done", **where, item=dict(item)),
        ]

    def _text(self, kind: str, text: str) -> list[Event]:
        """`text` into the open item of `kind`, opened first (closing another) if need be."""
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            item = {"id": new_id(ID_PREFIXES[kind]), "type": kind, "status": "in_progress"}
            item.update({"role": "assistant"} if kind == "message" else {"summary": []})
            item["content"] = []
            events.append(self._added(item))
            self._open = item
            events.append(
                self._event("response.content_part.added", **self._where(), part=_part(kind, ""))
            )
        self._open_text.append(text)
        if text:
            events.append(
                self._event(
                    f"response.{PARTS[kind]}.delta", **self._where(), delta=text, **_logprobs(kind)
                )
            )
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        where, item, kind = self._where(), self._open, self._open["type"]
        text = "".join(self._open_text)
        self._open, self._open_text = None, []
        part = _part(kind, text)
        item.update(
            content=[part], status="incomplete" if self.status == "incomplete" else "completed"
        )
        return [
            self._event(f"response.{PARTS[kind]}.done", **where, text=text, **_logprobs(kind)),
            self._event("response.content_part.done", **where, part=part),
            self._event(
                "response.output_item.done", output_index=where["output_index"], item=dict(item)
            ),
        ]

    def _where(self) -> dict[str, Any]:
        # NOTE: the open item is the last: an item is added only after it is closed.
        index = len(self.output) - 1
        return {"item_id": self._open["id"], "output_index": index, "content_index": 0}


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def _logprobs(kind: str) -> dict[str, list]:
    """A message's text events carry logprobs (none are asked for here: empty)."""
    return {"logprobs": []} if kind == "message" else {}
