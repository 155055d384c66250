"""A Responses body -> the `GenerateRequest` a chat completion of the same conversation makes,
and the worker's field paths -> the body's parameter names.

The conversation is chat's (openai_chat_schema.ChatMessage turns, set on the request by
openai_convert.fill_conversation): `instructions` is the system turn, then the stored turns of
`previous_response_id`, then `input`'s items: a message is its role's turn, `function_call`
items are an assistant turn's tool calls (consecutive ones one turn), a `function_call_output` is
a tool turn; reasoning is left out (responses_items.ReasoningItem). `text.format` is the
constraint chat's `response_format` makes.
"""

from __future__ import annotations

import json
import re

from intentserve.common.ids import new_request_id
from intentserve.controller.router.http.openai_chat_schema import (
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    ToolCallParam,
    ToolDefinition,
)
from intentserve.controller.router.http.openai_convert import TOOL_CHOICES, fill_conversation
from intentserve.controller.router.http.openai_schema import DEFAULT_TEMPERATURE
from intentserve.controller.router.http.reasoning_effort import set_effort
from intentserve.controller.router.http.responses_items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
)
from intentserve.controller.router.http.responses_schema import ResponsesRequest
from intentserve.v1 import inference_pb2

Turns = tuple[ChatMessage, ...]

# The worker names a bad field by its GenerateRequest path; the client named it this way.
PARAMS = {
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "stop.max_tokens": "max_output_tokens",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "tool_choice_function": "tool_choice",
    "reasoning_budget": "reasoning.effort",  # a model that does not think
}
_TOOL_FIELD = re.compile(r"tools\[(\d+)\]\.(\w+)")


def conversation(body: ResponsesRequest, previous: Turns = ()) -> Turns:
    """`previous` (a stored response's turns), then `input`'s (a function call may join the
    last turn)."""
    turns = list(previous)
    for item in body.items:
        if isinstance(item, MessageItem):
            turns.append(ChatMessage(role=item.role, content=item.text))
        elif isinstance(item, FunctionCallItem):
            call = ToolCallParam(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant":
                # NOTE: a copy: a stored turn is shared by the responses that continue it.
                calls = [*(last.tool_calls or []), call]
                turns[-1] = last.model_copy(update={"tool_calls": calls})
            else:
                turns.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            turns.append(ChatMessage(role="tool", content=item.text, tool_call_id=item.call_id))
    return tuple(turns)


def to_pb(body: ResponsesRequest, turns: Turns) -> inference_pb2.GenerateRequest:
    """`turns`: the stored turns and `input`'s (`conversation`); `instructions` go first."""
    sampling = inference_pb2.SamplingParams(
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=body.top_p or 0.0,  # 0 on the wire means "not set"
    )
    form = body.text_format
    if form is not None and form.type == "json_object":
        sampling.constraint.json_object = True
    elif form is not None and form.type == "json_schema":
        sampling.constraint.json_schema = json.dumps(form.schema_)
    stop = inference_pb2.StopConditions()
    if body.max_output_tokens is not None:
        stop.max_tokens = body.max_output_tokens
    request = inference_pb2.GenerateRequest(
        request_id=new_request_id(), sampling=sampling, stop=stop
    )
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    tools = [
        ToolDefinition(
            type="function",
            function=FunctionDefinition(
                name=t.name, description=t.description or "", parameters=t.parameters
            ),
        )
        for t in body.allowed_tools()
    ]
    fill_conversation(request, [*system, *turns], None, tools)
    choice = body.tool_choice
    if isinstance(choice, dict) and choice["type"] == "function":
        request.tool_choice = inference_pb2.TOOL_CHOICE_FUNCTION
        request.tool_choice_function = choice["name"]
    elif isinstance(choice, dict):  # allowed_tools: its tools (above), under its mode
        request.tool_choice = TOOL_CHOICES[choice["mode"]]
    else:
        request.tool_choice = TOOL_CHOICES[choice]
    # OpenAI's default is true; with required or a named function, false holds it to one call.
    request.parallel_tool_calls = bool(tools) and body.parallel_tool_calls is not False
    set_effort(request, body.reasoning.effort if body.reasoning else None)
    return request


def param_of(field_path: str, body: ResponsesRequest) -> str | None:
    """The body's parameter a worker's (or the router's) field path names; None when none."""
    if field_path.startswith("sampling.constraint"):
        return "text.format"
    if field_path in ("prompt", "prompt_token_ids", "chat") or field_path.startswith("messages"):
        # NOTE: the turns are the instructions', the stored ones' and input's: input is named.
        return "input"
    named = _TOOL_FIELD.fullmatch(field_path)
    if named is not None:
        name = body.allowed_tools()[int(named[1])].name
        index = next(i for i, t in enumerate(body.function_tools) if t.name == name)
        return f"tools[{index}].{named[2]}"
    return PARAMS.get(field_path)
