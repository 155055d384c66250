"""Anthropic's Messages bodies -> the `GenerateRequest` (and, for count_tokens, the
`TokenizeRequest`) a chat completion of the same conversation makes, and the worker's field paths
-> the body's. The turns become chat's turns and go through openai_convert's one
`fill_conversation`, so that both APIs render a conversation the same way:

    system (text or text blocks), a system turn   -> a system turn
    a user turn's text blocks                     -> one user turn (blocks a line apart)
    its tool_result blocks                        -> a tool turn each, in order, naming the call
    an assistant turn's text and tool_use blocks  -> one assistant turn with its tool calls
    its thinking blocks                           -> left out (as Anthropic leaves earlier
                                                     turns' thinking out of the prompt)

`is_error: true` is told to the model in the tool turn's text (`Error: ...`): chat templates
have no other place for it. `tool_choice` auto/any/tool/none is chat's auto/required/a named
function/none; `disable_parallel_tool_use` holds any/tool to one call. `thinking: disabled` sets
the template variable thinking models read (`enable_thinking: false`); the reply checks that no
thinking came (anthropic_reply.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from intentserve.common.ids import new_request_id
from intentserve.controller.router.http.anthropic_schema import (
    ConversationBody,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from intentserve.controller.router.http.openai_chat_schema import (
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    ToolCallParam,
    ToolDefinition,
)
from intentserve.controller.router.http.openai_convert import fill_conversation
from intentserve.controller.router.http.openai_schema import DEFAULT_TEMPERATURE
from intentserve.v1 import inference_pb2

IS_ERROR_PREFIX = "Error: "  # a tool_result with is_error: true, as the model reads it
TOOL_CHOICES = {
    None: inference_pb2.TOOL_CHOICE_UNSPECIFIED,
    "auto": inference_pb2.TOOL_CHOICE_AUTO,
    "any": inference_pb2.TOOL_CHOICE_REQUIRED,
    "tool": inference_pb2.TOOL_CHOICE_FUNCTION,
    "none": inference_pb2.TOOL_CHOICE_NONE,
}
# The worker names a bad field by its GenerateRequest path; the client named it this way.
PARAMS = {
    "prompt": "messages",
    "prompt_token_ids": "messages",
    "chat": "messages",
    "messages": "messages",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.top_k": "top_k",
    "stop.max_tokens": "max_tokens",
    "stop.stop": "stop_sequences",
    "tools": "tools",
    "tool_choice": "tool_choice.type",
    "tool_choice_function": "tool_choice.name",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "chat_template_kwargs": "thinking",  # set only for thinking: disabled
    "reasoning_budget": "thinking.budget_tokens",  # a model that does not think
}
_TURN = re.compile(r"messages\[(\d+)\]")
Names = Callable[[str], str | None]


def _texts(blocks) -> str:
    return "\n".join(b.text if isinstance(b, TextBlock) else b["text"] for b in blocks)


def _result_text(block: ToolResultBlock) -> str:
    content = block.content or ""
    text = content if isinstance(content, str) else _texts(content)
    return IS_ERROR_PREFIX + text if block.is_error else text


def conversation(body: ConversationBody) -> tuple[list[ChatMessage], list[str]]:
    """The turns as chat's, and the body's path each came from (the worker's errors name it)."""
    turns: list[ChatMessage] = []
    paths: list[str] = []

    def add(path: str, role: str, content: str, **extra) -> None:
        turns.append(ChatMessage(role=role, content=content, **extra))
        paths.append(path)

    for turn in body.turns:
        if turn.role == "assistant":
            calls = [
                ToolCallParam(
                    id=b.id, function=FunctionCall(name=b.name, arguments=json.dumps(b.input))
                )
                for b in turn.blocks
                if isinstance(b, ToolUseBlock)
            ]
            text = _texts(b for b in turn.blocks if isinstance(b, TextBlock))
            add(turn.path, "assistant", text, tool_calls=calls or None)
            continue
        said: list[TextBlock] = []
        for j, block in enumerate(turn.blocks):
            if isinstance(block, ToolResultBlock):
                if said:
                    add(turn.path, turn.role, _texts(said))
                    said = []
                path = f"{turn.path}.content[{j}]"
                add(path, "tool", _result_text(block), tool_call_id=block.tool_use_id)
            else:
                said.append(block)
        if said:
            add(turn.path, turn.role, _texts(said))
    return turns, paths


def tools_of(body: ConversationBody) -> list[ToolDefinition]:
    return [
        ToolDefinition(
            type="function",
            function=FunctionDefinition(
                name=t.name, description=t.description, parameters=t.input_schema
            ),
        )
        for t in body.tool_defs
    ]


def _template_kwargs(body: ConversationBody) -> dict | None:
    thinking = body.thinking
    return {"enable_thinking": False} if thinking and thinking.type == "disabled" else None


def names_for(paths: list[str]) -> Names:
    """The body's path for a worker's field path (`messages[3].content` -> the turn or block the
    fourth turn came from, `tools[0].parameters` -> `tools[0].input_schema`); None: none."""

    def name(field_path: str) -> str | None:
        turn = _TURN.match(field_path)
        if turn is not None:
            i = int(turn[1])
            return paths[i] if i < len(paths) else "messages"
        if field_path.startswith("tools["):
            return field_path.replace(".parameters", ".input_schema")
        if field_path.startswith("sampling.constraint"):
            return "output_config.format"
        return PARAMS.get(field_path)

    return name


def messages_request_to_pb(body: MessagesRequest) -> tuple[inference_pb2.GenerateRequest, Names]:
    sampling = inference_pb2.SamplingParams(
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_k=body.top_k or 0,
        top_p=body.top_p or 0.0,  # 0 on the wire means "not set"
    )
    form = body.output_config.format if body.output_config else None
    if form is not None:
        sampling.constraint.json_schema = json.dumps(form.schema_)
    stop = inference_pb2.StopConditions(max_tokens=body.max_tokens, stop=body.stop_sequences or [])
    request = inference_pb2.GenerateRequest(
        request_id=new_request_id(), sampling=sampling, stop=stop, n=1
    )
    turns, paths = conversation(body)
    tools = tools_of(body)
    fill_conversation(request, turns, _template_kwargs(body), tools)
    choice = body.tool_choice
    request.tool_choice = TOOL_CHOICES[choice.type if choice else None]
    if choice is not None and choice.type == "tool":
        request.tool_choice_function = choice.name
    # Anthropic's default lets a reply make several calls; disable_parallel_tool_use holds it
    # to one (under any or tool: the schema refused it under auto).
    one_call = choice is not None and bool(choice.disable_parallel_tool_use)
    request.parallel_tool_calls = bool(tools) and not one_call
    budget = body.thinking.budget if body.thinking else None
    if budget is not None:
        request.reasoning_budget = budget
    return request, names_for(paths)


def count_request_to_pb(body: ConversationBody) -> tuple[inference_pb2.TokenizeRequest, Names]:
    """The conversation's prompt, as Generate renders it (tool_choice none: without the tools,
    which the template is then not given)."""
    request = inference_pb2.TokenizeRequest()
    turns, paths = conversation(body)
    none = body.tool_choice is not None and body.tool_choice.type == "none"
    fill_conversation(request, turns, _template_kwargs(body), [] if none else tools_of(body))
    return request, names_for(paths)
