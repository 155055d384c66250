"""Which API's shape an HTTP error is given, chosen in this one place by the route's path prefix,
and the handlers that give every error the app answers that shape.

    OpenAI's (every route but those below): {"error": {"message", "type", "param", "code"}}
    Anthropic's (under /v1/messages):       {"type": "error", "error": {"type", "message"}}

The error itself is one value, `OpenAIError` (errors.py: a status, a message, the parameter
named, a code), whatever shape renders it. The handlers cover what the routes raise, FastAPI's
and Starlette's own `HTTPException`s (an unknown path is 404, a known path with the wrong method
405 with `Allow`), FastAPI's request validation, and any other exception (500, its text kept for
the log, not the client).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from intentserve.controller.router.http.errors import OpenAIError, from_request_validation
from starlette.exceptions import HTTPException


class ErrorShape(Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's Messages API and everything under it
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def shape_of(path: str) -> ErrorShape:
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return ErrorShape.ANTHROPIC
    return ErrorShape.OPENAI


def error_body(error: OpenAIError, shape: ErrorShape) -> dict[str, Any]:
    if shape is ErrorShape.ANTHROPIC:
        kind = ANTHROPIC_TYPES.get(error.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    return error.body()


def error_response(
    error: OpenAIError, path: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """`error` as the API that serves `path` shapes its errors."""
    return JSONResponse(error_body(error, shape_of(path)), error.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error `app` answers, in the shape of the API its path belongs to."""

    @app.exception_handler(OpenAIError)
    async def _ours(request: Request, error: OpenAIError) -> JSONResponse:
        return error_response(error, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(_from_http(request, error), request.url.path, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(from_request_validation(error), request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        # NOTE: Starlette re-raises it after this response, so the server logs its traceback.
        message = "the server failed on this request (its log has the error)"
        return error_response(OpenAIError(500, message, code="internal_error"), request.url.path)


def _from_http(request: Request, error: HTTPException) -> OpenAIError:
    """Routing's 404 and 405 name the method and the path; any other keeps its detail."""
    where = f"{request.method} {request.url.path}"
    if error.status_code == 404:
        message = f"{where}: not a path this server serves (README's HTTP API section lists them)"
        return OpenAIError(404, message, code="unknown_path")
    if error.status_code == 405:
        allow = (error.headers or {}).get("Allow", "")
        message = f"{where}: method not allowed; this path allows {allow}"
        return OpenAIError(405, message, code="method_not_allowed")
    return OpenAIError(error.status_code, str(error.detail))
