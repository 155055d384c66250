"""The request bodies of OpenAI's `/v1/completions` and `/v1/chat/completions` (with vLLM's
extra sampling fields), as far as this server honours them.

Only the JSON's shape is checked here (types, and the ranges the protobuf fields can hold); every
check of a value's meaning (temperature >= 0, top_p in (0, 1], max_tokens within the model length)
is the worker's, for HTTP and gRPC alike. Nothing is accepted and dropped: a field this server
does not know is refused naming it (`extra="forbid"`), and a known field whose value asks for
what nothing here does (`echo: true` in chat, completions' `tool_choice: "required"`) is refused
naming it.
`user` and `safety_identifier` are labels for the client's own accounting: they ask for nothing
and pass.

Structured outputs: OpenAI's `response_format` (`text`, `json_object`, `json_schema`) and vLLM's
`structured_outputs` (`json`, `regex`, `choice`, `json_object`: its current name for the
`guided_*` fields it removed in v0.12, which are unknown here), one of the two per request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from intentserve.controller.router.http.structured import ResponseFormat, StructuredOutputs
from pydantic import BaseModel, ConfigDict, Field, field_validator

UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy
MAX_CHOICES = 16  # n: the most choices one body may ask for (a worker may allow fewer)


class UnsupportedField(ValueError):
    """A field asks for something this server does not do; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _given(value: Any) -> bool:
    return value is not None


def _first_asked(model: BaseModel, refusals: dict[str, tuple[Callable[[Any], bool], str]]):
    """The first (field, message) of `refusals` whose value asks for something."""
    for name, (asks, message) in refusals.items():
        value = getattr(model, name)
        if value is not None and asks(value):
            return name, message
    return None


TOOLS = "completions take no tools (tool calling is chat's)"
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
# Fields that ask for what nothing here does: (does this value ask for it?, why refused).
REFUSALS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: not 1 <= v <= MAX_CHOICES, f"allowed: 1 to {MAX_CHOICES} choices"),
    "tool_choice": (lambda v: v != "none", f"{TOOLS}; allowed: 'none'"),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refusals: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = REFUSALS

    model: str
    max_tokens: UInt32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: UInt64 | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # a label: asks for nothing
    # Not in OpenAI's API; vLLM's names. top_k -1 (vLLM's "off") is 0 here.
    top_k: Annotated[int, Field(ge=-1, le=2**32 - 1)] | None = None
    min_p: float = 0.0
    repetition_penalty: float | None = None
    min_tokens: UInt32 = 0
    stop_token_ids: list[UInt32] | None = None
    ignore_eos: bool = False
    n: int | None = None  # choices, forked from one prompt by the worker (REFUSALS bounds it)
    echo: bool | None = None  # completions: the prompt before the completion; chat: refused
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    # Only its neutral value passes (REFUSALS).
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not key.isdigit() or int(key) >= 2**32:
                raise ValueError(f"key {key!r} is not a token id (a non-negative integer)")
        return bias

    def unsupported(self) -> UnsupportedField | None:
        """The first field that asks for what this server does not do."""
        asks = {
            "stream_options": (
                self.stream_options is not None and not self.stream,
                "only allowed when stream is true",
            ),
            # NOTE: 0 on the wire means "not set" (1), the opposite of what was asked.
            "top_p": (
                self.top_p == 0,
                "0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1 (for greedy "
                "decoding, send temperature 0)",
            ),
            "repetition_penalty": (
                self.repetition_penalty == 0,
                "0 is outside (0, inf); allowed: > 0 (1 is off)",
            ),
            **self._structured_problems(),
            **self._unsupported_here(),
        }
        first = next(((p, m) for p, (asked, m) in asks.items() if asked), None)
        first = first or _first_asked(self, self.refusals)
        return None if first is None else UnsupportedField(*first)

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        return {}

    def _structured_problems(self) -> dict[str, tuple[bool, str]]:
        formatted = self.response_format is not None and self.response_format.type != "text"
        if formatted and self.structured_outputs is not None:
            return {"structured_outputs": (True, "give response_format or structured_outputs")}
        problems = {}
        if self.structured_outputs is not None:
            problems.update(self.structured_outputs.problems("structured_outputs"))
        if self.response_format is not None:
            problems.update(self.response_format.problems("response_format"))
        return problems

    @property
    def constraint_param(self) -> str:
        """The parameter the client asked for structured outputs by (errors name it)."""
        return "structured_outputs" if self.structured_outputs is not None else "response_format"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def token_bias(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}


class CompletionRequest(_Request):
    refusals: ClassVar = {
        **REFUSALS,
        "best_of": (lambda v: v != 1, "only best_of=1 is supported"),
        "suffix": (bool, "suffix (insertion) is not supported"),
    }

    # Text, token ids, or a batch of one of either.
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: UInt32 | None = None
    best_of: int | None = None
    suffix: str | None = None

    @property
    def prompt_text(self) -> str | None:
        """The prompt as text (None: given as token ids)."""
        prompt = self.prompt[0] if isinstance(self.prompt, list) and self.prompt else self.prompt
        return prompt if isinstance(prompt, str) else None

    def _unsupported_here(self) -> dict[str, tuple[bool, str]]:
        batched = isinstance(self.prompt, list) and bool(self.prompt)
        batched = batched and not isinstance(self.prompt[0], int) and len(self.prompt) != 1
        return {"prompt": (batched, "one prompt per request: batched prompts are not supported")}


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


def conversation_unsupported(
    messages: list[ChatMessage], tools: list[ToolDefinition] | None
) -> UnsupportedField | None:
    """The first field of a conversation's turns or tools that asks for what is not done (chat
    completions and /tokenize alike)."""
    for i, message in enumerate(messages):
        asked = _first_asked(message, ChatMessage.refusals)
        if asked is not None:
            return UnsupportedField(f"messages[{i}].{asked[0]}", asked[1])
    for i, tool in enumerate(tools or []):
        if tool.function.strict:
            return UnsupportedField(
                f"tools[{i}].function.strict",
                "the arguments are not constrained to the schema; allowed: false",
            )
    return None


class ChatCompletionRequest(_Request):
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

    messages: list[ChatMessage]
    max_completion_tokens: UInt32 | None = None
    logprobs: bool = False
    top_logprobs: UInt32 | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    safety_identifier: str | None = None  # a label, as `user`: asks for nothing
    tools: list[ToolDefinition] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    modalities: list[str] | None = None
    service_tier: str | None = None

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
