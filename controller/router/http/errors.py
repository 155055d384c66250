"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
status its SDK expects.

A routed request's error is first given its gRPC status by the controller's one exception ->
status table (so HTTP and gRPC clients are told the same thing), then the status its HTTP code:
INVALID_ARGUMENT 400 (naming the parameter), UNAUTHENTICATED 401, NOT_FOUND 404,
RESOURCE_EXHAUSTED 429, UNAVAILABLE 503 (with the readiness reason while not ready).
"""

from __future__ import annotations

from typing import Any

import grpc
from intentserve.common.field_errors import violation_of
from intentserve.common.status import lookup
from intentserve.controller.errors import NotReady
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_convert import param_of
from intentserve.controller.router.http.openai_schema import CompletionRequest, UnsupportedField
from intentserve.controller.status_codes import STATUS_CODES
from pydantic import ValidationError

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


def from_validation(error: ValidationError) -> OpenAIError:
    """A body of the wrong shape: the first problem, naming its parameter (`messages[1].role`)."""
    first = error.errors()[0]
    param = _param_path(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = (
            "not honoured by this server, so refused (README's HTTP API section lists every "
            "field it honours)"
        )
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


def from_unsupported(error: UnsupportedField) -> OpenAIError:
    return OpenAIError(400, f"{error.param}: {error}", param=error.param)


def from_routing(error: Exception, body: CompletionRequest | ChatCompletionRequest) -> OpenAIError:
    """What the router (or the worker behind it) refused, as the gRPC client would be told."""
    code, message = lookup(STATUS_CODES, error)
    status = HTTP_STATUS.get(code, 500)
    if isinstance(error, NotReady):
        return OpenAIError(status, message, code=error.reason.code.value)
    param = None
    violation = violation_of(error)
    if code is grpc.StatusCode.INVALID_ARGUMENT and violation is not None:
        # NOTE: the worker's BadRequest detail names the field by its GenerateRequest path.
        param = param_of(violation.field, body)
        if param is not None:
            message = f"{param}: {violation.description}"
    return OpenAIError(status, message, param=param, code=code.name.lower())
