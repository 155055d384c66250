"""The body of OpenAI's `/v1/chat/completions`, and the conversation it carries (turns and their
text parts, the tools and an assistant turn's calls to them), which `/tokenize` takes too.
Checked as `openai_schema.py` says: the JSON's shape only, and a field that asks for what nothing
here does is refused naming it; the fields both endpoints share are `OpenAIRequest`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from intentserve.controller.router.http.openai_schema import (
    REFUSALS,
    OpenAIRequest,
    UInt32,
    UnsupportedField,
    first_asked,
)
from intentserve.controller.router.http.reasoning_effort import Effort
from intentserve.controller.router.request_size import MAX_MESSAGES, MAX_TOOLS
from pydantic import BaseModel, ConfigDict, Field, field_validator


def _given(value: Any) -> bool:
    return value is not None


TOOL_CHOICES = ("auto", "none", "required")


def names_a_function(value: Any) -> bool:
    """OpenAI's named tool choice, `{"type": "function", "function": {"name": ...}}`."""
    function = value.get("function") if isinstance(value, dict) else None
    return (
        isinstance(function, dict)
        and value.keys() == {"type", "function"}
        and value["type"] == "function"
        and function.keys() == {"name"}
        and isinstance(function["name"], str)
    )


CHAT_TOOL_CHOICE = (
    lambda v: v not in TOOL_CHOICES and not names_a_function(v),
    "allowed: 'auto', 'none', 'required', {'type': 'function', 'function': {'name': ...}}",
)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # true asks for the arguments constrained to the schema: refused


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str  # a JSON object, as text


class ToolCallParam(BaseModel):
    """A call in an assistant turn (what the reply's `tool_calls` held)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # What the SDK's own reply object dumps passes when empty; a value asks for something.
    refusals: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "name": (_given, "participant names are not supported"),
        "function_call": (_given, "the deprecated function_call is not supported; send tool_calls"),
        "audio": (_given, "audio is not supported (this deployment serves a text model)"),
        "refusal": (_given, "a refusal turn is not supported; send it as content"),
        "annotations": (bool, "annotations are not supported"),
    }

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # an assistant turn's
    tool_call_id: str | None = None  # a tool turn's
    function_call: Any = None
    audio: Any = None
    refusal: str | None = None
    annotations: list[Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """A part of another type (an image, audio) is refused naming it, before the union's
        other member reports that a list is not a string."""
        if isinstance(content, list):
            for i, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"part {i} is of type {kind!r}; allowed: text parts (this deployment "
                        "serves a text model)"
                    )
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


# A list over its bound (request_size.py) is refused as it is parsed, its items not validated
# (the router's own check would come after they are validated and converted, on its event loop:
# 250,000 turns took 1.7 s); errors.py words the refusal as the router does.
Messages = Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)]
Tools = Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)]


def conversation_unsupported(
    messages: list[ChatMessage], tools: list[ToolDefinition] | None
) -> UnsupportedField | None:
    """The first field of a conversation's turns or tools that asks for what is not done (chat
    completions and /tokenize alike)."""
    for i, message in enumerate(messages):
        asked = first_asked(message, ChatMessage.refusals)
        if asked is not None:
            return UnsupportedField(f"messages[{i}].{asked[0]}", asked[1])
    for i, tool in enumerate(tools or []):
        if tool.function.strict:
            return UnsupportedField(
                f"tools[{i}].function.strict",
                "the arguments are not constrained to the schema; allowed: false",
            )
    return None


class ChatCompletionRequest(OpenAIRequest):
    refusals: ClassVar = {
        **REFUSALS,
        "tool_choice": CHAT_TOOL_CHOICE,
        "echo": (bool, "echo is not supported for chat (completions echo the prompt)"),
        "store": (bool, "nothing is stored by this server; allowed: false"),
        "modalities": (lambda v: v != ["text"], "only text is served; allowed: ['text']"),
        "service_tier": (
            lambda v: v not in ("auto", "default"),
            "one tier is served; allowed: 'auto', 'default'",
        ),
    }

    messages: Messages
    max_completion_tokens: UInt32 | None = None
    logprobs: bool = False
    top_logprobs: UInt32 | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    safety_identifier: str | None = None  # a label, as `user`: asks for nothing
    tools: Tools | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    modalities: list[str] | None = None
    service_tier: str | None = None
    # A thinking model's budget of thinking (reasoning_effort.py); a model that does not think
    # refuses it, naming it.
    reasoning_effort: Effort | None = None

    def unsupported(self) -> UnsupportedField | None:
        return conversation_unsupported(self.messages, self.tools) or super().unsupported()

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        return {
            "top_logprobs": (
                self.top_logprobs is not None and not self.logprobs,
                "only allowed when logprobs is true",
            ),
            "parallel_tool_calls": (
                self.parallel_tool_calls is False
                and bool(self.tools)
                and self.tool_choice in (None, "auto"),
                "with tool_choice 'auto' nothing keeps the model to one call; false is "
                "honoured with tool_choice 'required' or a named function",
            ),
        }

    @property
    def num_logprobs(self) -> int | None:
        """How many alternatives per token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_tokens_param(self) -> str:
        """The name the client gave its limit by (errors about it name that one)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
