"""The items of OpenAI's Responses API that this server reads: `input`'s items (messages, function
calls and their outputs, reasoning) and their content parts, and the function tools.

Each item is told by its `type` (a message may leave it out) and read as that type's model
(`parse_item`, `parse_tool`), so that a problem is named by its whole path
(`input[2].content[0].text`). An item, part or tool of a type nothing here serves (a built-in
tool, its calls, images) is refused naming its `type` and saying what it is. A field of a served
type that asks for what is not done is refused naming it, as chat's are; one that only describes
an earlier item (its `id`, `status`, a text's `annotations` and `logprobs`) asks for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from intentserve.controller.router.http.errors import from_validation
from intentserve.controller.router.http.openai_schema import UnsupportedField, first_asked
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

Model = TypeVar("Model", bound=BaseModel)
Refusals = dict[str, tuple[Callable[[Any], bool], str]]
Status = Literal["in_progress", "completed", "incomplete"]

_BUILT_IN = "a built-in tool's, which this server does not have"
_TEXT_MODEL = "this deployment serves a text model"
# Every item type of the SDK's ResponseInputItemParam that is not served, and what it is.
ITEM_REFUSALS = {
    **{
        kind: f"{what} ({_BUILT_IN})"
        for kind, what in {
            "file_search_call": "a file search call",
            "computer_call": "a computer use call",
            "computer_call_output": "a computer use call's output",
            "web_search_call": "a web search call",
            "tool_search_call": "a tool search call",
            "tool_search_output": "a tool search's output",
            "image_generation_call": "an image generation call",
            "code_interpreter_call": "a code interpreter call",
            "local_shell_call": "a local shell call",
            "local_shell_call_output": "a local shell call's output",
            "shell_call": "a shell call",
            "shell_call_output": "a shell call's output",
            "apply_patch_call": "an apply_patch call",
            "apply_patch_call_output": "an apply_patch call's output",
            "mcp_list_tools": "an MCP server's tool list",
            "mcp_approval_request": "an MCP approval request",
            "mcp_approval_response": "an MCP approval response",
            "mcp_call": "an MCP call",
            "program": "a programmatic tool call",
            "program_output": "a programmatic tool call's output",
        }.items()
    },
    "custom_tool_call": "a custom (free-form) tool's call; custom tools are not served",
    "custom_tool_call_output": "a custom (free-form) tool's output; custom tools are not served",
    "additional_tools": "tools added mid-conversation are not served; give them in `tools`",
    "configuration_update": "a configuration update is not served",
    "compaction": "compacted context is not served (nothing here compacts a conversation)",
    "compaction_trigger": "compaction is not served (nothing here compacts a conversation)",
    "item_reference": "a stored item is not referenced by id here; use previous_response_id",
}
SERVED_ITEMS = "'message', 'function_call', 'function_call_output', 'reasoning'"
# Every tool type of the SDK's ToolParam but `function`, and what it is.
TOOL_REFUSALS = {
    **{
        kind: f"{what}, a built-in tool this server does not have"
        for kind, what in {
            "file_search": "file search",
            "computer": "computer use",
            "computer_use_preview": "computer use",
            "web_search": "web search",
            "web_search_2025_08_26": "web search",
            "web_search_preview": "web search",
            "web_search_preview_2025_03_11": "web search",
            "mcp": "MCP (remote tool servers)",
            "code_interpreter": "the code interpreter",
            "programmatic_tool_calling": "programmatic tool calling",
            "image_generation": "image generation",
            "local_shell": "the local shell",
            "shell": "the shell",
            "tool_search": "tool search",
            "apply_patch": "apply_patch",
        }.items()
    },
    "custom": "custom tools (free-form input) are not served",
    "namespace": "tool namespaces are not served",
}


def given(value: Any) -> bool:
    return value is not None


def _not_direct(caller: Any) -> bool:
    return caller != {"type": "direct"}


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    refusals: ClassVar[Refusals] = {}  # each field that asks for what is not done, and why

    def unsupported(self) -> tuple[str, str] | None:
        return first_asked(self, self.refusals)


class TextPart(Item):
    """A message's text: `input_text` (what was said to the model) or `output_text` (what it
    said, sent back)."""

    refusals = {
        "prompt_cache_breakpoint": (given, "cache breakpoints are not set here; leave it out"),
        "annotations": (bool, "annotations are not supported"),
    }

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier output's: empty
    logprobs: list[Any] | None = None  # an earlier output's: asks for nothing
    prompt_cache_breakpoint: Any = None


PART_REFUSALS = {
    "input_image": f"an image ({_TEXT_MODEL})",
    "input_file": f"a file ({_TEXT_MODEL})",
    "input_audio": f"audio ({_TEXT_MODEL})",
    "refusal": "a refusal part is not supported; send it as text",
}


class MessageItem(Item):
    """EasyInputMessage, Message, and an earlier output message sent back."""

    refusals = {"phase": (given, "message phases are not read here; leave it out")}

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: Status | None = None
    phase: str | None = None

    _text: str = PrivateAttr("")

    @property
    def text(self) -> str:
        return self._text

    def read_parts(self, param: str) -> None:
        """Its parts' text, each part read by its type."""
        if isinstance(self.content, str):
            self._text = self.content
            return
        parts = [
            parse_part(part, f"{param}.content[{i}]", PART_REFUSALS)
            for i, part in enumerate(self.content)
        ]
        self._text = "".join(part.text for part in parts)


class FunctionCallItem(Item):
    """A call the model made (an earlier output's `function_call` item)."""

    refusals = {
        "namespace": (given, "tool namespaces are not served"),
        "caller": (_not_direct, "only direct calls are made here; allowed: {'type': 'direct'}"),
        "async_": (bool, "asynchronous calls are not made here; allowed: false"),
    }

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str  # a JSON object, as text
    id: str | None = None
    status: Status | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None
    async_: bool | None = Field(None, alias="async")


class FunctionCallOutputItem(Item):
    """What the client's code returned for a call (`call_id`), for the model's next turn."""

    refusals = {
        "namespace": (given, "tool namespaces are not served"),
        "caller": (_not_direct, "only direct calls are made here; allowed: {'type': 'direct'}"),
    }

    type: Literal["function_call_output"]
    # NOTE: optional in the SDK's type, but the tool turn answers one call: required here.
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: Status | None = None
    name: str | None = None  # the function's: a label, the call_id says which call
    namespace: str | None = None
    caller: dict[str, Any] | None = None

    _text: str = PrivateAttr("")

    @property
    def text(self) -> str:
        return self._text

    def read_parts(self, param: str) -> None:
        if isinstance(self.output, str):
            self._text = self.output
            return
        refusals = {**PART_REFUSALS, "output_text": "output parts are input_text here"}
        parts = [
            parse_part(part, f"{param}.output[{i}]", refusals) for i, part in enumerate(self.output)
        ]
        self._text = "".join(part.text for part in parts)


class ReasoningItem(Item):
    """An earlier output's reasoning, sent back. NOTE: taken, and left out of the prompt: a
    turn has no field for its thinking (ChatMessage), and OpenAI too drops earlier turns'
    reasoning from the context."""

    refusals = {"encrypted_content": (given, "encrypted reasoning is not read here (none is made)")}

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = []
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEMS: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


class FunctionTool(Item):
    """A function the client's code runs; the model may call it (`tools[i]`)."""

    refusals = {
        "strict": (bool, "the arguments are not constrained to the schema; allowed: false"),
        "allowed_callers": (
            lambda v: set(v) - {"direct"},
            "only direct calls are made here; allowed: ['direct']",
        ),
        "defer_loading": (bool, "deferred tools (tool search) are not served; allowed: false"),
        "output_schema": (given, "an output schema is not read here; leave it out"),
        "async_": (bool, "asynchronous calls are not made here; allowed: false"),
    }

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]
    parameters: dict[str, Any] | None = None
    # NOTE: OpenAI's default is true; here false (what the worker does), true is refused.
    strict: bool | None = None
    description: str | None = None
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    output_schema: dict[str, Any] | None = None
    async_: bool | None = Field(None, alias="async")


def parse_as(model: type[Model], value: Any, param: str) -> Model:
    """`value` read as `model`; its first problem is UnsupportedField naming its path from
    `param`."""
    try:
        parsed = model.model_validate(value)
    except ValidationError as error:
        refused = from_validation(error)
        path = param + (f".{refused.param}" if refused.param else "")
        raise UnsupportedField(path, refused.message.removeprefix(f"{refused.param}: ")) from None
    asked = parsed.unsupported()
    if asked is not None:
        raise UnsupportedField(f"{param}.{asked[0].rstrip('_')}", asked[1])
    return parsed


def _kind(value: Any, param: str, default: str | None = None) -> str:
    kind = value.get("type", default) if isinstance(value, dict) else None
    if not isinstance(kind, str):
        raise UnsupportedField(f"{param}.type", "required: the item's type")
    return kind


def parse_item(value: Any, param: str) -> InputItem:
    """One of `input`'s items; a message may leave out its type."""
    kind = _kind(value, param, "message" if isinstance(value, dict) and "role" in value else None)
    if kind in ITEMS:
        item = parse_as(ITEMS[kind], value, param)
        if isinstance(item, MessageItem | FunctionCallOutputItem):
            item.read_parts(param)
        return item
    why = ITEM_REFUSALS.get(kind, "not an item type of the Responses API")
    raise UnsupportedField(f"{param}.type", f"{kind!r}: {why}; allowed: {SERVED_ITEMS}")


def parse_part(value: Any, param: str, refusals: dict[str, str]) -> TextPart:
    kind = _kind(value, param)
    if kind in refusals or kind not in ("input_text", "output_text"):
        why = refusals.get(kind, "not a content part's type")
        raise UnsupportedField(f"{param}.type", f"{kind!r}: {why}; allowed: text parts")
    return parse_as(TextPart, value, param)


def parse_tool(value: Any, param: str) -> FunctionTool:
    kind = _kind(value, param)
    if kind != "function":
        why = TOOL_REFUSALS.get(kind, "not a tool type of the Responses API")
        raise UnsupportedField(f"{param}.type", f"{kind!r}: {why}; allowed: 'function'")
    return parse_as(FunctionTool, value, param)
