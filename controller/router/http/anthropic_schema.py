"""The bodies of Anthropic's `POST /v1/messages` and `POST /v1/messages/count_tokens`, as far as
this server honours them, and the conversation they carry read into typed turns.

As for OpenAI's bodies (openai_schema.py): the JSON's shape is checked here and every value's
meaning is the worker's; a field no model here knows is refused naming it (`extra="forbid"`), and
a known field whose value asks for what nothing here does is refused naming its path
(`messages[2].content[0].type`: Anthropic's errors have no `param`, so the message names it).

A turn's content blocks and the tools are read in two steps: the body keeps them as JSON objects,
and `unsupported()` reads each by its `type` into its block model, so that a block of a type
not read here (an image, a document, a server tool's result) is refused naming its own path and
what its turn allows, where a union's validation error would name only the list.

What is honoured: `system` (text or text blocks) and system turns; text, `tool_use` and
`tool_result` blocks (text or text blocks, `is_error`); `thinking` blocks sent back (left out of
the prompt, as Anthropic leaves earlier turns' thinking out); custom `tools` and every
`tool_choice`; `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k`;
`output_config.format` (a JSON schema the reply is held to); `metadata.user_id` and
`user_profile_id` (labels); `service_tier` (one tier serves both values); `cache_control`
without a `ttl` (a breakpoint asks for the prefix to be cached: the worker's prefix cache, where
it is realized, caches every prefix already; no lifetime is promised, so a `ttl` is refused).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from intentserve.controller.router.http.errors import from_validation
from intentserve.controller.router.http.openai_schema import UInt32, UnsupportedField
from intentserve.controller.router.request_size import MAX_MESSAGES, MAX_TOOLS
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

NO_VISION = "this deployment serves a text model (no vision)"
SERVER_TOOLS = (
    "server tools (web_search, web_fetch, bash, code_execution, text_editor, computer, memory, "
    "tool_search) are not run by this server"
)
# The block types each role's content may hold here.
ALLOWED_BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking"),
    "system": ("text",),
}
# Why a block type no turn here holds is refused (any other type: it is not read here).
REFUSED_BLOCKS = {
    "image": f"image blocks are not read: {NO_VISION}",
    "document": "documents are not read; send their text as a text block",
    "search_result": "search result blocks are not read; send their text as a text block",
    "redacted_thinking": "this server never sends redacted thinking, so none can come back",
    "server_tool_use": SERVER_TOOLS,
    "container_upload": "no container is run by this server",
}
NO_TTL = (
    "no cache lifetime is promised (the prefix cache keeps blocks until the pool needs them); "
    "allowed: {'type': 'ephemeral'}"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: str | None = None


class _Cached(_Strict):
    cache_control: CacheControl | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        ttl = self.cache_control is not None and self.cache_control.ttl is not None
        return {f"{path}.cache_control.ttl": (ttl, NO_TTL)}


class TextBlock(_Cached):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None  # this server cites nothing, so none come back

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        cited = (bool(self.citations), "this server sends no citations; allowed: none")
        return {**super().problems(path), f"{path}.citations": cited}


class ToolUseBlock(_Cached):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        server_called = self.caller is not None and self.caller != {"type": "direct"}
        return {
            **super().problems(path),
            f"{path}.caller": (server_called, f"{SERVER_TOOLS}; allowed: {{'type': 'direct'}}"),
            f"{path}.toolset_name": (self.toolset_name is not None, "no toolsets are served"),
        }


class ToolResultBlock(_Cached):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None  # text, or text blocks (read below)
    is_error: bool = False  # true: the tool turn says so ("Error: ..."), anthropic_convert.py
    toolset_name: str | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        unset = (self.toolset_name is not None, "no toolsets are served")
        return {**super().problems(path), f"{path}.toolset_name": unset}


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str


BLOCKS: dict[str, type[_Strict]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
}


class MessageParam(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolDef(_Cached):
    """A custom tool: the only kind this server has (a server tool's type is refused)."""

    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    input_schema: dict[str, Any]
    strict: bool | None = None
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[dict[str, Any]] | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        return {
            **super().problems(path),
            f"{path}.strict": (
                bool(self.strict),
                "the input is not constrained to the schema; allowed: false",
            ),
            f"{path}.allowed_callers": (
                self.allowed_callers not in (None, ["direct"]),
                f"{SERVER_TOOLS}; allowed: ['direct']",
            ),
            f"{path}.defer_loading": (bool(self.defer_loading), "no tool search; allowed: false"),
            f"{path}.eager_input_streaming": (
                bool(self.eager_input_streaming),
                "each call's input is streamed whole, once it parses; allowed: false",
            ),
            f"{path}.input_examples": (
                bool(self.input_examples),
                "examples are not given to the model; put them in the description",
            ),
        }


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type 'tool': the tool the reply must call
    disable_parallel_tool_use: bool | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        return {
            f"{path}.name": (
                (self.name is not None) != (self.type == "tool"),
                "given exactly when type is 'tool'",
            ),
            f"{path}.disable_parallel_tool_use": (
                bool(self.disable_parallel_tool_use) and self.type in ("auto", "none"),
                "with type 'auto' nothing keeps the model to one call; true is honoured with "
                "type 'any' or 'tool'",
            ),
        }


class Thinking(_Strict):
    """`thinking`: `enabled` with `budget_tokens` is a thinking model's budget of thinking (a
    model that does not think refuses it, naming it); `adaptive` thinks as the model does;
    `disabled` sets the template variable thinking models read."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: Literal["summarized", "omitted"] | None = None

    @property
    def budget(self) -> int | None:
        return self.budget_tokens if self.type == "enabled" else None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        return {
            f"{path}.budget_tokens": (
                (self.type == "enabled") != (self.budget_tokens is not None),
                "required with type 'enabled' (the most tokens of thinking), and only there",
            ),
            f"{path}.type": (
                self.type == "between_tools",
                "allowed: 'enabled' (with budget_tokens), 'adaptive', 'disabled'",
            ),
            f"{path}.display": (
                self.display == "summarized",
                "thinking is not summarized here; allowed: 'omitted', or leave it out for the "
                "whole thinking",
            ),
        }


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """`format`: a JSON schema the reply follows; `effort`: only `high`, Anthropic's default,
    which asks for nothing beyond what no effort asks."""

    effort: str | None = None
    format: OutputFormat | None = None

    def problems(self, path: str) -> dict[str, tuple[bool, str]]:
        asked = self.effort not in (None, "high")
        return {
            f"{path}.effort": (
                asked,
                "no other effort level is taken here; allowed: 'high' (the default), or leave "
                "it out",
            )
        }


class Metadata(_Strict):
    user_id: str | None = None  # a label for the client's own accounting: asks for nothing


Messages = Annotated[list[MessageParam], Field(max_length=MAX_MESSAGES)]
Tools = Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)]


class Turn:
    """One message of the conversation, its content read into blocks."""

    def __init__(self, role: str, blocks: list[_Strict], path: str) -> None:
        self.role, self.blocks, self.path = role, blocks, path


def read_typed(model: type[BaseModel], data: Any, path: str):
    """`data` as `model`, or the UnsupportedField naming its first problem under `path`."""
    try:
        value = model.model_validate(data)
    except ValidationError as error:
        refused = from_validation(error)
        inner = f".{refused.param}" if refused.param else ""
        message = refused.message.removeprefix(f"{refused.param}: ") if inner else refused.message
        return UnsupportedField(path + inner, message)
    problems = value.problems(path) if hasattr(value, "problems") else {}
    first = next(((p, m) for p, (asked, m) in problems.items() if asked), None)
    return value if first is None else UnsupportedField(*first)


def read_blocks(content: str | list[dict[str, Any]], allowed: tuple[str, ...], path: str):
    """A turn's (or `system`'s, or a tool result's) content as blocks; text is one text block."""
    if isinstance(content, str):
        return [TextBlock(type="text", text=content)]
    blocks = []
    for i, block in enumerate(content):
        kind, where = block.get("type"), f"{path}[{i}]"
        if kind not in allowed:
            why = "missing, or not a block type's name"
            if isinstance(kind, str):
                why = REFUSED_BLOCKS.get(kind, f"{kind!r} blocks are not read here")
                why = SERVER_TOOLS if kind.endswith("_tool_result") else why
            return UnsupportedField(f"{where}.type", f"{why}; allowed: {', '.join(allowed)}")
        typed = read_typed(BLOCKS[kind], block, where)
        if isinstance(typed, UnsupportedField):
            return typed
        blocks.append(typed)
    return blocks


class ConversationBody(_Strict):
    """What both bodies share: the conversation, its tools and what shapes the prompt."""

    model: str
    messages: Messages
    system: str | list[dict[str, Any]] | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None  # a label, as metadata.user_id
    workspace_id: str | None = None
    _turns: list[Turn] = PrivateAttr(default_factory=list)
    _tools: list[ToolDef] = PrivateAttr(default_factory=list)

    def unsupported(self) -> UnsupportedField | None:
        """The first field that asks for what is not done; the turns and tools read."""
        return self._read_conversation() or self._first_refused(self._refusals())

    def _refusals(self) -> dict[str, tuple[bool, str]]:
        ttl = self.cache_control is not None and self.cache_control.ttl is not None
        return {
            "cache_control.ttl": (ttl, NO_TTL),
            "speed": (self.speed == "fast", "one speed is served; allowed: 'standard'"),
            "workspace_id": (self.workspace_id is not None, "this server has no workspaces"),
            **(self.tool_choice.problems("tool_choice") if self.tool_choice else {}),
            **(self.thinking.problems("thinking") if self.thinking else {}),
            **(self.output_config.problems("output_config") if self.output_config else {}),
            "tool_choice.name": (
                self.tool_choice is not None
                and self.tool_choice.type == "tool"
                and self.tool_choice.name not in {t.name for t in self._tools},
                "names none of the request's tools",
            ),
        }

    @staticmethod
    def _first_refused(asks: dict[str, tuple[bool, str]]) -> UnsupportedField | None:
        first = next(((p, m) for p, (asked, m) in asks.items() if asked), None)
        return None if first is None else UnsupportedField(*first)

    def _read_conversation(self) -> UnsupportedField | None:
        turns = []
        if self.system is not None:
            blocks = read_blocks(self.system, ALLOWED_BLOCKS["system"], "system")
            if isinstance(blocks, UnsupportedField):
                return blocks
            turns.append(Turn("system", blocks, "system"))
        for i, message in enumerate(self.messages):
            path = f"messages[{i}]"
            blocks = read_blocks(message.content, ALLOWED_BLOCKS[message.role], f"{path}.content")
            if isinstance(blocks, UnsupportedField):
                return blocks
            for j, block in enumerate(blocks):
                if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                    where = f"{path}.content[{j}].content"
                    inner = read_blocks(block.content, ("text",), where)
                    if isinstance(inner, UnsupportedField):
                        return inner
            turns.append(Turn(message.role, blocks, path))
        if self.messages and self.messages[-1].role == "assistant":
            return UnsupportedField(
                f"messages[{len(self.messages) - 1}].role",
                "a last assistant turn (a prefill to continue) is not continued here; allowed: "
                "a conversation that ends with a user turn",
            )
        tools = []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") not in (None, "custom"):
                return UnsupportedField(
                    f"tools[{i}].type", f"{SERVER_TOOLS}; allowed: 'custom', or leave it out"
                )
            typed = read_typed(ToolDef, tool, f"tools[{i}]")
            if isinstance(typed, UnsupportedField):
                return typed
            tools.append(typed)
        self._turns, self._tools = turns, tools
        return None

    @property
    def turns(self) -> list[Turn]:
        return self._turns

    @property
    def tool_defs(self) -> list[ToolDef]:
        return self._tools


class CountTokensRequest(ConversationBody):
    """`/v1/messages/count_tokens`: the conversation only."""


class MessagesRequest(ConversationBody):
    max_tokens: UInt32
    stop_sequences: list[str] | None = None
    stream: bool = False
    # Not in the SDK's typed parameters (it sends them as extra_body); Anthropic's API takes them.
    temperature: float | None = None
    top_p: float | None = None
    top_k: UInt32 | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier serves both
    container: Any = None
    diagnostics: Any = None
    inference_geo: str | None = None

    def _refusals(self) -> dict[str, tuple[bool, str]]:
        refusals = super()._refusals()
        budget = self.thinking.budget if self.thinking else None
        if budget is not None and budget >= self.max_tokens:  # the thinking counts toward it
            refusals["thinking.budget_tokens"] = (
                True,
                f"{budget} is not less than max_tokens ({self.max_tokens}), which the thinking "
                "counts toward",
            )
        return {
            **refusals,
            # NOTE: 0 on the wire means "not set" (1), the opposite of what was asked.
            "top_p": (
                self.top_p == 0,
                "0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1",
            ),
            "container": (self.container is not None, "no container is run by this server"),
            "diagnostics": (
                self.diagnostics is not None,
                "no prompt-cache diagnostics are reported; leave it out",
            ),
            "inference_geo": (
                self.inference_geo is not None,
                "one place serves every request here; leave it out",
            ),
        }
