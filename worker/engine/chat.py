"""A conversation as a prompt: system, user, assistant and tool turns, and the tools the model may
call, rendered through the model's chat template so that the reply is the next assistant turn.

    Conversation.of([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    Conversation.user("Hi")  # what `chat=True` makes of a text prompt

The template gets what Hugging Face's templates read: each turn as `{"role", "content"}`, an
assistant turn's calls as `tool_calls: [{"id", "type": "function", "function": {"name",
"arguments": {...}}}]` (the arguments an object), a tool turn's `tool_call_id`, and, with
tool_choice auto, `tools: [{"type": "function", "function": {"name", "description",
"parameters"}}]`. A template that never reads `tools` is not given them: the request is refused.

Errors name the field as a client sends it: `messages`, `messages[1].role`, `tools[0].parameters`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

from intentserve.worker.engine.constraint import (
    NESTED_TOO_DEEP,
    Constraint,
    grammar_for_tool_choice,
)
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.engine.tool_calls import ToolCall

ROLES = ("system", "user", "assistant", "tool")
# NOTE: counted before a conversation is read or rendered, since each turn, call and tool costs
# pure-Python time (the template is Jinja): 10^5 turns took 0.9 s to read and 2.8 s to render
# and tokenize, while 2048 render in about 5 ms. The turns' and tools' limits are OpenAI's own,
# which a router checks too (controller/router/request_size.py), before any worker sees them.
MAX_NUM_MESSAGES = 2048  # turns
MAX_NUM_TOOL_CALLS = 2048  # in all the turns
MAX_NUM_TOOLS = 128
# What render() itself gives the template; chat_template_kwargs cannot replace them.
RESERVED_TEMPLATE_VARIABLES = (
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
)


class ToolChoice(enum.Enum):
    AUTO = "auto"  # the template is given the tools; the reply's calls are parsed
    NONE = "none"  # the template is not given the tools; the reply is text
    # As AUTO, and the reply is one call of any of them (a grammar); one or more with
    # `Conversation.parallel_tool_calls`.
    REQUIRED = "required"
    FUNCTION = "function"  # as REQUIRED, of the one tool `Conversation.tool_function` names


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is a JSON Schema object as JSON text ("" for
    none)."""

    name: str
    description: str = ""
    parameters: str = ""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's
    tool_call_id: str = ""  # a tool turn's: the call it answers


def check_size(messages: Sequence[Any], tools: Sized) -> None:
    """Refuse a conversation of more than MAX_NUM_MESSAGES turns, MAX_NUM_TOOL_CALLS tool calls
    or MAX_NUM_TOOLS tools, by their number alone. `messages`: turns with `tool_calls`
    (ChatMessage values, or a request's protobuf turns before they are read)."""
    if len(tools) > MAX_NUM_TOOLS:
        raise InvalidRequestError("tools", f"has {len(tools)} tools; at most {MAX_NUM_TOOLS}")
    # NOTE: the turns first: counting their calls reads each of them.
    if len(messages) > MAX_NUM_MESSAGES:
        raise InvalidRequestError(
            "messages", f"has {len(messages)} turns; at most {MAX_NUM_MESSAGES}"
        )
    num_calls = sum(len(m.tool_calls) for m in messages)
    if num_calls > MAX_NUM_TOOL_CALLS:
        raise InvalidRequestError(
            "messages", f"has {num_calls} tool calls in all; at most {MAX_NUM_TOOL_CALLS}"
        )


def _json_object(text: str, field: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidRequestError(field, f"is not JSON: {error}") from None
    except RecursionError:
        raise InvalidRequestError(field, NESTED_TOO_DEEP) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(field, f"must be a JSON object, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Conversation:
    """A non-empty list of turns, each with a role of `ROLES`, the tools the model may call, and
    extra variables for the chat template (`{"enable_thinking": False}` for Qwen3's)."""

    messages: tuple[ChatMessage, ...]
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice.AUTO
    tool_function: str = ""  # with ToolChoice.FUNCTION only: the tool the reply calls
    parallel_tool_calls: bool = False  # REQUIRED, FUNCTION: one or more calls, not exactly one

    def __post_init__(self) -> None:
        if (self.tool_choice is ToolChoice.FUNCTION) != bool(self.tool_function):
            raise InvalidRequestError(
                "tool_choice_function",
                "names the one tool to call with tool_choice FUNCTION, and only then",
            )
        if not self.messages:
            raise InvalidRequestError("messages", "must not be empty")
        check_size(self.messages, self.tools)
        reserved = sorted(set(self.template_kwargs) & set(RESERVED_TEMPLATE_VARIABLES))
        if reserved:
            raise InvalidRequestError(
                "chat_template_kwargs",
                f"{', '.join(reserved)} cannot be set here; the server renders them",
            )
        for i, message in enumerate(self.messages):
            if message.role not in ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role",
                    f"{message.role!r} is not one of {', '.join(ROLES)}",
                )
            if message.tool_calls and message.role != "assistant":
                raise InvalidRequestError(
                    f"messages[{i}].tool_calls",
                    f"only an assistant turn calls tools, not a {message.role} turn",
                )
            if (message.role == "tool") != bool(message.tool_call_id):
                raise InvalidRequestError(
                    f"messages[{i}].tool_call_id",
                    "a tool turn names the call it answers; only a tool turn has one",
                )
        for i, tool in enumerate(self.tools):
            if not tool.name:
                raise InvalidRequestError(f"tools[{i}].name", "must not be empty")

    def kept_text(self) -> bytes:
        """The UTF-8 text that any rendering of this conversation contains, in separate places:
        each turn's content and each tool's name and description given to the template, less
        the whitespace around them (which `trim` drops). A lower bound on the prompt's tokens
        with no rendering (tokenizer.min_num_tokens).

        NOTE: it assumes what Hugging Face's templates do: each turn's content is kept. One
        that drops a turn's text (Qwen3's drops the thinking of earlier replies) makes the
        bound too high for it; a conversation is then refused that might have fit."""
        texts = [m.content.strip() for m in self.messages]
        if self.parses_tool_calls:
            texts += [f"{t.name}{t.description.strip()}" for t in self.tools]
        # NOTE: a lone surrogate (only the SDK can send one) counts as one byte here; the
        # rendered prompt is refused for it before it is tokenized.
        return "".join(texts).encode("utf-8", "replace")

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the reply's tool calls are parsed out of its text."""
        return bool(self.tools) and self.tool_choice is not ToolChoice.NONE

    def tool_call_constraint(self) -> Constraint | None:
        """What holds the reply to its calls (REQUIRED, FUNCTION); None where nothing does."""
        if self.tool_choice is ToolChoice.REQUIRED:
            choice: str | dict[str, Any] = "required"
        elif self.tool_choice is ToolChoice.FUNCTION:
            choice = {"type": "function", "function": {"name": self.tool_function}}
        else:
            return None
        tools = self._template_tools().get("tools", [])
        return grammar_for_tool_choice(tools, choice, self.parallel_tool_calls)

    def _template_messages(self) -> list[dict[str, Any]]:
        turns = []
        for i, m in enumerate(self.messages):
            turn: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                turn["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": _json_object(
                                call.arguments, f"messages[{i}].tool_calls[{j}].arguments"
                            ),
                        },
                    }
                    for j, call in enumerate(m.tool_calls)
                ]
            if m.tool_call_id:
                turn["tool_call_id"] = m.tool_call_id
            turns.append(turn)
        return turns

    def _template_tools(self) -> dict[str, Any]:
        """`{"tools": [...]}` when the template is given tools, else nothing."""
        if not self.parses_tool_calls:
            return {}
        tools = []
        for i, tool in enumerate(self.tools):
            function: dict[str, Any] = {"name": tool.name, "description": tool.description}
            if tool.parameters:
                function["parameters"] = _json_object(tool.parameters, f"tools[{i}].parameters")
            tools.append({"type": "function", "function": function})
        return {"tools": tools}

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = ()) -> Conversation:
        """From `{"role": ..., "content": ...}` dicts (the SDK's `LLM.chat`); an assistant turn
        may carry `tool_calls` (ToolCall values, as a reply gives them), a tool turn its
        `tool_call_id`; content None is empty."""
        if not messages or not all(
            isinstance(m, Mapping) and {"role", "content"} <= m.keys() for m in messages
        ):
            raise InvalidRequestError(
                "messages", 'must be a non-empty list of {"role": ..., "content": ...} dicts'
            )
        return cls(
            tuple(
                ChatMessage(
                    str(m["role"]),
                    "" if m["content"] is None else str(m["content"]),
                    tuple(m.get("tool_calls") or ()),
                    str(m.get("tool_call_id") or ""),
                )
                for m in messages
            ),
            tools=tuple(tools),
        )

    @classmethod
    def user(cls, prompt: str) -> Conversation:
        return cls((ChatMessage("user", prompt),))

    def render(self, tokenizer, field: str = "messages") -> str:
        """The prompt text the model was trained on for this conversation, ending where the
        assistant's reply begins; a template that refuses it is an error naming `field`."""
        messages, tools = self._template_messages(), self._template_tools()
        # NOTE: a model with no template at all is refused below, naming `field`.
        if tools and tokenizer.chat_template is not None and not tokenizer.template_reads("tools"):
            raise InvalidRequestError(
                "tools",
                "this model's chat template never reads `tools`, so the model would not see "
                "them; serve it with a template that does (spec.model.chatTemplate), or send "
                "tool_choice none",
            )
        try:
            return tokenizer.apply_chat_template(messages, **self.template_kwargs, **tools)
        except ValueError as error:
            raise InvalidRequestError(field, str(error)) from None
