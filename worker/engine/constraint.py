"""What a request's output must look like (structured outputs): any JSON object, a JSON schema,
one of a list of strings, a regular expression, a free grammar (Lark or GBNF), or one
Hermes-style tool call. A value, checked
for shape where it is made; grammar.py compiles it against a model's vocabulary.

`grammar_for_tool_choice` turns OpenAI's `tools` and `tool_choice` (`required`, or a named
function) into the constraint that makes the reply one call the Hermes/Qwen tool parser reads,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, or (parallel tool calls) one or
more such calls, a line apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from intentserve.worker.engine.sampling import InvalidRequestError

FIELD = "constraint"  # the engine's name for the request field; the edges rename it
MAX_CONSTRAINT_CHARS = 256 * 1024  # a schema, a pattern or all choices together
# JSON nested past what Python's parser recurses into (the router refuses past 32 levels first).
NESTED_TOO_DEEP = "is JSON nested too deep to read (more levels than the parser recurses into)"
MAX_CHOICES = 1024
TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"


class ConstraintKind(Enum):
    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # `text` is the schema, as JSON
    CHOICE = "choice"  # exactly one of `choices`
    REGEX = "regex"  # `text` is a pattern (Rust regex syntax, no look-around) the output matches
    TOOL_CALL = "tool_call"  # `text` is the schema of the call object inside the tags
    TOOL_CALLS = "tool_calls"  # as TOOL_CALL, one or more calls a line apart
    GRAMMAR = "grammar"  # `text` is a free grammar, Lark or GBNF (as llguidance reads them)


TOOL_CALL_KINDS = (ConstraintKind.TOOL_CALL, ConstraintKind.TOOL_CALLS)


@dataclass(frozen=True)
class Constraint:
    """Hashable: the grammar cache's key."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"{FIELD}.{self.kind.value}"
        size = len(self.text) + sum(len(c) for c in self.choices)
        if size > MAX_CONSTRAINT_CHARS:
            raise InvalidRequestError(where, f"{size} characters; at most {MAX_CONSTRAINT_CHARS}")
        if self.kind in (ConstraintKind.JSON_SCHEMA, *TOOL_CALL_KINDS):
            try:
                schema = json.loads(self.text)
            except ValueError as error:
                raise InvalidRequestError(where, f"is not valid JSON: {error}") from None
            except RecursionError:
                raise InvalidRequestError(where, NESTED_TOO_DEEP) from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(
                    where, f"must be a JSON schema (an object), got {type(schema).__name__}"
                )
        if self.kind in (ConstraintKind.REGEX, ConstraintKind.GRAMMAR) and not self.text:
            raise InvalidRequestError(where, "must not be empty")
        if self.kind == ConstraintKind.CHOICE:
            if not 1 <= len(self.choices) <= MAX_CHOICES:
                raise InvalidRequestError(
                    where, f"{len(self.choices)} choices; allowed: 1 to {MAX_CHOICES}"
                )
            if not all(isinstance(c, str) and c for c in self.choices):
                raise InvalidRequestError(where, "each choice must be a non-empty string")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool) -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True))


def grammar_for_tool_choice(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str | Mapping[str, Any],
    parallel_tool_calls: bool = False,
) -> Constraint | None:
    """OpenAI's `tools` and `tool_choice` -> the constraint that enforces the call; None where
    nothing is enforced (`auto`, `none`). `required`: one call of any of the tools; a named
    function (`{"type": "function", "function": {"name": ...}}`): one call of that one. With
    `parallel_tool_calls`, one or more such calls. InvalidRequestError names `tools` or
    `tool_choice`."""
    if tool_choice in ("auto", "none"):
        return None
    functions = _functions(tools)
    if tool_choice == "required":
        if not functions:
            raise InvalidRequestError("tools", "tool_choice 'required' needs at least one tool")
        chosen = functions
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            raise InvalidRequestError(
                "tool_choice",
                f"names function {name!r}, which tools lacks (have: {sorted(functions)})",
            )
        chosen = {name: functions[name]}
    else:
        raise InvalidRequestError(
            "tool_choice",
            f"{tool_choice!r}; allowed: 'auto', 'none', 'required', "
            "{'type': 'function', 'function': {'name': ...}}",
        )
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in sorted(chosen.items())
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    kind = ConstraintKind.TOOL_CALLS if parallel_tool_calls else ConstraintKind.TOOL_CALL
    return Constraint(kind, json.dumps(schema, sort_keys=True))


def _functions(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{name: its parameters' schema} of OpenAI's function tools."""
    functions = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if tool.get("type") == "function" else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(
                f"tools[{i}]", "allowed: {'type': 'function', 'function': {'name': ..., ...}}"
            )
        functions[name] = function.get("parameters") or {"type": "object"}
    return functions
