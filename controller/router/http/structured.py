"""The request fields that ask for structured outputs: OpenAI's `response_format` and vLLM's
`structured_outputs`. Their shape only; the worker compiles the schema or pattern and refuses,
naming the field, what does not compile or what the model's vocabulary cannot express."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`. `strict` passes either way: the schema is enforced."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def problems(self, param: str) -> dict[str, tuple[bool, str]]:
        wants_schema = self.type == "json_schema"
        return {
            f"{param}.json_schema": (
                wants_schema != (self.json_schema is not None),
                "given exactly when type is 'json_schema'",
            ),
            f"{param}.json_schema.schema": (
                wants_schema and self.json_schema is not None and self.json_schema.schema_ is None,
                "required: the JSON schema the output must be valid against",
            ),
        }


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of these (`grammar`: Lark or GBNF, as
    llguidance reads them). Its `structural_tag`, `whitespace_pattern` and `disable_*` options
    are unknown here, so refused naming them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # a schema, or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def problems(self, param: str) -> dict[str, tuple[bool, str]]:
        asked = (self.json_, self.regex, self.choice, self.grammar, self.json_object)
        given = [v for v in asked if v is not None]
        return {
            param: (
                len(given) != 1,
                "set exactly one of json, regex, choice, grammar, json_object",
            ),
            f"{param}.json_object": (self.json_object is False, "allowed: true"),
        }
