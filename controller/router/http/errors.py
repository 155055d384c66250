"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
status its SDK expects.

A routed request's error is first given its gRPC status by the controller's one exception ->
status table (so HTTP and gRPC clients are told the same thing), then the status its HTTP code:
INVALID_ARGUMENT 400 (naming the parameter), UNAUTHENTICATED 401, NOT_FOUND 404,
RESOURCE_EXHAUSTED 429, UNAVAILABLE 503 (with the readiness reason while not ready).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, get_args

import grpc
import pydantic_core
from fastapi.exceptions import RequestValidationError
from intentserve.common.field_errors import violation_of
from intentserve.common.status import lookup
from intentserve.controller.errors import NotReady, WrongTask
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_convert import param_of
from intentserve.controller.router.http.openai_schema import CompletionRequest, UnsupportedField
from intentserve.controller.router.nesting import MAX_JSON_DEPTH
from intentserve.controller.router.request_size import COUNT_BOUNDS, over_count
from intentserve.controller.status_codes import STATUS_CODES
from pydantic import BaseModel, ValidationError

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = TYPES.get(self.status, "server_error")
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}


# How deep the body's parser (jiter, pydantic's) reads; deeper, it stops and says where.
BODY_PARSER_DEPTH = 200
_PARSER_STOPPED = re.compile(r"recursion limit exceeded at line (\d+) column (\d+)")


def from_validation(error: ValidationError, schema: type[BaseModel] | None = None) -> OpenAIError:
    """A body of the wrong shape: the first problem, naming its parameter (`messages[1].role`).
    `schema`: the body's, which names the field a body too deep to parse was deep in."""
    first = error.errors()[0]
    param = _param_path(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    stopped = _PARSER_STOPPED.search(message) if first["type"] == "json_invalid" else None
    if stopped is not None:
        param = _deep_param(first["input"], int(stopped[1]), int(stopped[2]), schema)
        message = (
            f"nested deeper than the {BODY_PARSER_DEPTH} levels a body is read to; allowed: at "
            f"most {MAX_JSON_DEPTH} levels of JSON in a field"
        )
    if first["type"] == "too_long" and param in COUNT_BOUNDS:
        message = over_count(param, first["ctx"]["actual_length"])
    if first["type"] == "extra_forbidden":
        message = (
            "not honoured by this server, so refused (README's HTTP API section lists every "
            "field it honours)"
        )
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param or None)


def from_request_validation(error: RequestValidationError) -> OpenAIError:
    """FastAPI's own check of a route's declared parameters: the first problem, naming it
    (its location, `query` or `body`, dropped)."""
    first = error.errors()[0]
    param = _param_path(tuple(first["loc"])[1:])
    message = first["msg"].removeprefix("Value error, ")
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param or None)


def _param_path(loc: tuple) -> str:
    """("messages", 1, "content") -> "messages[1].content"; pydantic's union-member tags
    (`str`, `list[int]`, `function-after[...]`) end the path."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in ("str", "int", "float", "bool", "list", "dict"):
            path += f".{part}" if path else part
        else:
            break
    return path


def _deep_param(body: bytes | str, line: int, column: int, schema) -> str:
    """The field the parser stopped in: the body up to where it stopped, parsed as a partial
    body (shallower by a level, so it parses), ends inside that field's value; the path to its
    end is followed as far as `schema` has fields (`tools[2].function.parameters`)."""
    text = body.encode() if isinstance(body, str) else body  # NOTE: jiter's column counts bytes
    start = len(text) - len(text.split(b"\n", line - 1)[-1])
    try:
        value = pydantic_core.from_json(text[: start + column - 1], allow_partial=True)
    except ValueError:
        return ""
    path, model = "", schema
    while isinstance(value, dict | list) and value:
        if isinstance(value, list):
            path, value = path + f"[{len(value) - 1}]", value[-1]
            continue
        key = next(reversed(value))
        path, value = (f"{path}.{key}" if path else key), value[key]
        model = _model_of(_annotation(model, key))
        if model is None:  # a field that holds JSON, or one the schema lacks: this one
            break
    return path


def _annotation(model: type[BaseModel] | None, key: str) -> Any:
    fields = model.model_fields if model is not None else {}
    return next((f.annotation for n, f in fields.items() if key in (n, f.alias)), None)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The body model a field's annotation holds (`list[ToolDefinition] | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_of, get_args(annotation))), None)


def from_unsupported(error: UnsupportedField) -> OpenAIError:
    return OpenAIError(400, f"{error.param}: {error}", param=error.param)


def from_routing(
    error: Exception,
    body: CompletionRequest | ChatCompletionRequest,
    names: Callable[[str], str | None] | None = None,
) -> OpenAIError:
    """What the router (or the worker behind it) refused, as the gRPC client would be told.
    `names`: the door's own map of the worker's field paths to its body's (else OpenAI's)."""
    code, message = lookup(STATUS_CODES, error)
    status = HTTP_STATUS.get(code, 500)
    if isinstance(error, NotReady):
        return OpenAIError(status, message, code=error.reason.code.value)
    if isinstance(error, WrongTask):  # the model asked serves another task
        return OpenAIError(status, f"model: {message}", param="model", code="wrong_task")
    param = None
    violation = violation_of(error)
    if code is grpc.StatusCode.INVALID_ARGUMENT and violation is not None:
        # NOTE: the worker's BadRequest detail names the field by its GenerateRequest path.
        param = param_of(violation.field, body) if names is None else names(violation.field)
        if param is not None:
            message = f"{param}: {violation.description}"
    return OpenAIError(status, message, param=param, code=code.name.lower())
