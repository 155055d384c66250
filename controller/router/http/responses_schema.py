"""The body of OpenAI's `POST /v1/responses`, as far as this server honours it. Checked as
`openai_schema.py` says: the JSON's shape only (the worker checks the values' meaning), a field no
one here knows refused naming it (`extra="forbid"`), and a known field whose value asks for what
nothing here does refused naming it, with what is allowed. Its items and tools are read one at a
time by their type (responses_items.py), so that a problem names its path.

Honoured: `input` (text, or items), `instructions` (the system turn), `tools` (functions),
`tool_choice` (with `allowed_tools`), `parallel_tool_calls`, `text.format` (structured outputs:
the grammar path chat's `response_format` takes), `max_output_tokens`, `temperature`, `top_p`,
`stream`, `store` and `previous_response_id` (responses_store.py), `metadata` (kept and returned).
`user` and `safety_identifier` are labels for the client's accounting; returned, they ask for
nothing. Everything else asks for what is not done here, and is refused by name (`REFUSALS`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from intentserve.controller.router.http.openai_chat_schema import TOOL_CHOICES
from intentserve.controller.router.http.openai_schema import UInt32, UnsupportedField, first_asked
from intentserve.controller.router.http.reasoning_effort import Effort
from intentserve.controller.router.http.responses_items import (
    FunctionTool,
    InputItem,
    Refusals,
    given,
    parse_item,
    parse_tool,
)
from intentserve.controller.router.request_size import MAX_MESSAGES, MAX_TOOLS
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

# OpenAI's bounds on `metadata`.
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512


NOT_A_FUNCTION = "a tool of a kind this server does not have (its tools are functions)"
# Fields that ask for what nothing here does: (does this value ask for it?, why refused).
REFUSALS: Refusals = {
    "background": (
        bool,
        "background responses are not served (each is answered on its own "
        "connection); allowed: false",
    ),
    "background_options": (given, "background responses are not served"),
    "conversation": (
        given,
        "conversations are not stored here; chain responses with previous_response_id",
    ),
    "prompt": (given, "stored prompt templates are not served; send input and instructions"),
    "top_logprobs": (
        bool,
        "log-probabilities are not returned by this endpoint (chat "
        "completions return them); allowed: 0",
    ),
    "max_tool_calls": (given, "it bounds built-in tool calls, and no built-in tool is served"),
    "truncation": (
        lambda v: v != "disabled",
        "a conversation is never truncated to fit: one "
        "too long for the model is refused; allowed: 'disabled'",
    ),
    "service_tier": (
        lambda v: v not in ("auto", "default"),
        "one tier is served; allowed: 'auto', 'default'",
    ),
    "prompt_cache_key": (
        given,
        "requests are not routed by a cache key here (prefix caching "
        "matches prompts by their tokens); leave it out",
    ),
    "prompt_cache_options": (given, "prompt caching is not configured per request here"),
    "prompt_cache_retention": (given, "prompt caching is not configured per request here"),
    "context_management": (bool, "nothing here compacts a conversation; allowed: []"),
    "access_programs": (given, "access programs are not served"),
    "image": (given, "images are not served (this deployment serves a text model)"),
    "moderation": (given, "moderation is not served"),
}


class TextFormat(BaseModel):
    """`text.format`: `text`, `json_object`, or `json_schema` with its name and schema (flat,
    unlike chat's `response_format`). `strict` passes either way: the schema is enforced."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    def problems(self) -> dict[str, tuple[bool, str]]:
        wants_schema = self.type == "json_schema"
        return {
            f"text.format.{name}": (
                wants_schema != (getattr(self, field) is not None),
                f"given exactly when type is 'json_schema'{why}",
            )
            for name, field, why in (
                ("name", "name", ""),
                ("schema", "schema_", ": the JSON schema the output must be valid against"),
            )
        }


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: str | None = None  # refused: nothing here sets how much the model says


class ReasoningConfig(BaseModel):
    """`reasoning`: `effort` is a thinking model's budget of thinking (reasoning_effort.py; a
    model that does not think refuses it, naming it); every other option is refused; `{}` and
    nulls pass."""

    model_config = ConfigDict(extra="forbid")
    refusals: ClassVar[Refusals] = {
        "summary": (given, "reasoning summaries are not made here; leave it out"),
        "generate_summary": (given, "reasoning summaries are not made here; leave it out"),
        "context": (given, "which turns' reasoning is kept is not set here; leave it out"),
        "mode": (given, "one reasoning mode is served; leave it out"),
    }

    effort: Effort | None = None
    summary: str | None = None
    generate_summary: str | None = None
    context: str | None = None
    mode: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_obfuscation: bool | None = None  # true refused: events are never padded here


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refusals: ClassVar[Refusals] = REFUSALS

    model: str
    # Text is one user turn; items are read one at a time (`items`).
    input: Annotated[list[Any], Field(max_length=MAX_MESSAGES)]
    instructions: str | None = None
    tools: Annotated[list[Any], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: UInt32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = None  # None: true, as OpenAI's
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None  # a label: asks for nothing
    safety_identifier: str | None = None  # a label, as `user`
    reasoning: ReasoningConfig | None = None
    service_tier: str | None = None
    truncation: str | None = None
    background: bool | None = None
    include: list[str] | None = None
    top_logprobs: UInt32 | None = None
    # Refused when given (REFUSALS).
    background_options: Any = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    context_management: Any = None
    access_programs: Any = None
    image: Any = None
    moderation: Any = None

    _items: list[InputItem] = PrivateAttr(default_factory=list)
    _tools: list[FunctionTool] = PrivateAttr(default_factory=list)
    _problem: UnsupportedField | None = PrivateAttr(None)

    @field_validator("input", mode="before")
    @classmethod
    def _text_is_a_user_turn(cls, value: Any) -> Any:
        return [{"role": "user", "content": value}] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _read_items(self) -> ResponsesRequest:
        """Each item and tool by its type; the first problem is kept for `unsupported`."""
        try:
            self._items = [parse_item(v, f"input[{i}]") for i, v in enumerate(self.input)]
            self._tools = [parse_tool(v, f"tools[{i}]") for i, v in enumerate(self.tools or [])]
        except UnsupportedField as problem:
            self._problem = problem
        return self

    @property
    def items(self) -> list[InputItem]:
        return self._items

    @property
    def function_tools(self) -> list[FunctionTool]:
        return self._tools

    @property
    def stores(self) -> bool:
        return self.store is not False

    @property
    def text_format(self) -> TextFormat | None:
        return self.text.format if self.text is not None else None

    def unsupported(self) -> UnsupportedField | None:
        """The first field that asks for what this server does not do."""
        if self._problem is not None:
            return self._problem
        asks = {
            "input": (not self.input, "give at least one item (or text)"),
            "top_p": (
                self.top_p == 0,
                "0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1 (for greedy "
                "decoding, send temperature 0)",
            ),
            "stream_options": (
                self.stream_options is not None and not self.stream,
                "only allowed when stream is true",
            ),
            "stream_options.include_obfuscation": (
                self.stream_options is not None and bool(self.stream_options.include_obfuscation),
                "events are not padded here; allowed: false",
            ),
            "include": (
                bool(self.include),
                f"{(self.include or [''])[0]!r}: nothing optional is added to a response "
                "here; allowed: []",
            ),
            "text.verbosity": (
                self.text is not None and self.text.verbosity is not None,
                "how much the model says is not set here; leave it out",
            ),
            **(self.text_format.problems() if self.text_format is not None else {}),
            "tool_choice": (self._tool_choice_problem() is not None, self._tool_choice_problem()),
            "parallel_tool_calls": (
                self.parallel_tool_calls is False
                and bool(self.tools)
                and self.tool_choice in (None, "auto"),
                "with tool_choice 'auto' nothing keeps the model to one call; false is "
                "honoured with tool_choice 'required' or a named function",
            ),
            "metadata": (self._metadata_problem() is not None, self._metadata_problem()),
        }
        first = next(((p, m) for p, (asked, m) in asks.items() if asked), None)
        if first is None and self.reasoning is not None:
            asked = first_asked(self.reasoning, ReasoningConfig.refusals)
            first = asked and (f"reasoning.{asked[0]}", asked[1])
        first = first or first_asked(self, self.refusals)
        return None if first is None else UnsupportedField(*first)

    def _tool_choice_problem(self) -> str | None:
        choice = self.tool_choice
        if choice is None or choice in TOOL_CHOICES:
            return None
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "function" and choice.keys() == {"type", "name"}:
            return None
        if kind == "allowed_tools" and choice.keys() == {"type", "mode", "tools"}:
            return self._allowed_tools_problem(choice)
        if kind in BUILT_IN_CHOICES:
            return f"{kind!r}: {NOT_A_FUNCTION}; allowed: {ALLOWED_CHOICES}"
        return f"allowed: {ALLOWED_CHOICES}"

    def _allowed_tools_problem(self, choice: dict[str, Any]) -> str | None:
        names = {tool.name for tool in self._tools}
        if choice["mode"] not in ("auto", "required"):
            return "allowed_tools: mode allowed: 'auto', 'required'"
        entries = choice["tools"] if isinstance(choice["tools"], list) else [None]
        for entry in entries:
            if not (
                isinstance(entry, dict)
                and entry.keys() == {"type", "name"}
                and entry["type"] == "function"
                and entry["name"] in names
            ):
                return (
                    f"allowed_tools: {entry!r} is not one of the tools; allowed: "
                    "{'type': 'function', 'name': ...} naming a function in tools"
                )
        return None

    def allowed_tools(self) -> list[FunctionTool]:
        """The tools the model may call: `tools`, or those tool_choice's allowed_tools names."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            allowed = {entry["name"] for entry in choice["tools"]}
            return [tool for tool in self._tools if tool.name in allowed]
        return self._tools

    def _metadata_problem(self) -> str | None:
        pairs = self.metadata or {}
        too_long = [k for k, v in pairs.items() if len(k) > MAX_METADATA_KEY_CHARS] or [
            k for k, v in pairs.items() if len(v) > MAX_METADATA_VALUE_CHARS
        ]
        if len(pairs) > MAX_METADATA_PAIRS or too_long:
            return (
                f"allowed: at most {MAX_METADATA_PAIRS} pairs, keys of at most "
                f"{MAX_METADATA_KEY_CHARS} characters, values of at most "
                f"{MAX_METADATA_VALUE_CHARS}"
            )
        return None


ALLOWED_CHOICES = (
    "'auto', 'none', 'required', {'type': 'function', 'name': ...}, "
    "{'type': 'allowed_tools', 'mode': 'auto' or 'required', 'tools': [...]}"
)
# The SDK's tool_choice types that name a tool other than a function.
BUILT_IN_CHOICES = frozenset(
    {
        "file_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "computer",
        "computer_use",
        "computer_use_preview",
        "image_generation",
        "code_interpreter",
        "mcp",
        "custom",
        "programmatic_tool_calling",
        "apply_patch",
        "shell",
    }
)
