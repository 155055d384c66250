"""What every front door of the HTTP API (OpenAI's chat and completions, its Responses, Anthropic's
Messages, embeddings) is served through, so that each one is only its schema and its reply:

    doors.authorize(request)                 # the deployment's API key, or 401
    body = await doors.body(request)         # the body, bounded (413), a cut-off one counted (400)
    doors.check_model(name)                  # the served model, or 404 naming `model`
    call = await doors.route(request, pb)    # the router's refusal raised here, before any reply
    async for response in call: ...          # GenerateResponses, each tagged with its choice
    call.end()                               # also when the client went away: the worker aborts

A refusal (not ready, overloaded, a bad field) comes before the first response, so that a stream
is refused with its HTTP status too, not inside the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Request
from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.controller.router.http.access import mark_routed, request_id_of
from intentserve.controller.router.http.bridge import HttpCall, RoutedResponses
from intentserve.controller.router.http.errors import OpenAIError
from intentserve.v1 import inference_pb2
from starlette.requests import ClientDisconnect

if TYPE_CHECKING:
    from intentserve.controller.router.http.app import Frontend

# The largest request body read: twice the largest request the controller forwards, room for
# JSON's escapes (streaming.MAX_REQUEST_BYTES). A larger one is refused (413) before it is read,
# so that no client's body can take the memory every other client is served from.
MAX_BODY_BYTES = 2 * MAX_REQUEST_BYTES


class RoutedCall:
    """One GenerateRequest routed for one HTTP request, on the HTTP server's loop. Made by
    `Doors.route`, which has read its first response (or the router's refusal) already."""

    def __init__(self, request: Request, responses: RoutedResponses, call: HttpCall) -> None:
        self._responses = responses
        self._call = call
        self._watcher = asyncio.create_task(_cancel_on_disconnect(request, call))
        self._first: inference_pb2.GenerateResponse | None = None

    async def _open(self) -> None:
        try:
            self._first = await anext(self._responses)
        except StopAsyncIteration:  # the client went away before anything came
            self._first = None
        except BaseException:
            self.end()
            raise

    async def __aiter__(self) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Every response of the call, its first first; the router's error after the first is
        raised here."""
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for response in self._responses:
            yield response

    def end(self) -> None:
        """Idempotent: stops watching the client and cancels the call (after its last response
        this changes nothing upstream)."""
        self._watcher.cancel()
        self._call.cancel()


class Doors:
    """The checks and the routing every front door shares, over the frontend's parts."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend

    def authorize(self, request: Request, token: str | None = None) -> None:
        """401 unless the request carries one of the deployment's API keys: `token` when the
        door has its own header (Anthropic's `x-api-key`), else `Authorization: Bearer ...`."""
        if token is None:
            token = _bearer(request)
        if not self.frontend.security.admits_client(token):
            raise OpenAIError(401, "a valid API key is required", code="invalid_api_key")

    def client_key(self, request: Request) -> str | None:
        """The key an authorized request was admitted with (`Authorization: Bearer ...`);
        None where no keys are set, and every client is one."""
        return _bearer(request) if self.frontend.security.api_keys else None

    async def body(self, request: Request) -> bytes:
        return await read_body(request)

    def check_model(self, name: str) -> None:
        names = self.frontend.model_names
        if name not in names:
            raise OpenAIError(
                404,
                f"model {name!r} is not served here; this deployment serves "
                + " or ".join(repr(served) for served in names),
                param="model",
                code="model_not_found",
            )

    async def route(self, request: Request, pb: inference_pb2.GenerateRequest) -> RoutedCall:
        """`pb` routed under the request's id; the router's refusal is raised (untranslated:
        each door words it in its own API's terms)."""
        pb.request_id = request_id_of(request.scope)
        mark_routed(request.scope)
        call = HttpCall()
        routed = RoutedCall(request, RoutedResponses(self.frontend.router, pb, call), call)
        await routed._open()
        return routed


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header.removeprefix("Bearer ") if header.startswith("Bearer ") else None


async def read_body(request: Request) -> bytes:
    """The body, up to MAX_BODY_BYTES; a larger one is 413, refused by its content-length before
    anything is read, or, sent without one, as soon as what came is over."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(f"{int(declared)} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _too_large(f"over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # The client closed (or the body deadline closed it, connection_guard.py) before its
        # body ended: its refusal, counted, with no one to answer and nothing to log as an error.
        raise OpenAIError(
            400,
            f"request body: the connection closed after {size} bytes, before the body ended",
            code="incomplete_body",
        ) from None
    return b"".join(chunks)


def _too_large(what: str) -> OpenAIError:
    message = f"request body: {what}; allowed: at most {MAX_BODY_BYTES}"
    return OpenAIError(413, message, code="request_too_large")


async def _cancel_on_disconnect(request: Request, call: HttpCall) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    call.cancel()
