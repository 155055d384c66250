"""Anthropic's Messages API, served through the doors every API here shares (doors.py):

    POST /v1/messages               a Message (stream: Anthropic's server-sent events)
    POST /v1/messages/count_tokens  {"input_tokens": n}: the conversation's prompt, tokenized
                                    by a READY worker as a message of it is computed

The key is Anthropic's `x-api-key` header or `Authorization: Bearer ...` (what the official SDK
sends). `anthropic-version` is one of API_VERSIONS, or left out; `anthropic-beta` names only the
betas this server does (BETAS: each of them is generally available here); any other is refused
naming the header. Errors are Anthropic's shape (error_shapes.py), their message naming the
field's path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from intentserve.controller.router.http.anthropic_betas import BETAS, IGNORED_HEADER
from intentserve.controller.router.http.anthropic_convert import (
    Names,
    count_request_to_pb,
    messages_request_to_pb,
)
from intentserve.controller.router.http.anthropic_reply import MessageReply, sse
from intentserve.controller.router.http.anthropic_schema import (
    ConversationBody,
    CountTokensRequest,
    MessagesRequest,
)
from intentserve.controller.router.http.doors import Doors, RoutedCall
from intentserve.controller.router.http.error_shapes import ErrorShape, error_body
from intentserve.controller.router.http.errors import (
    OpenAIError,
    from_routing,
    from_unsupported,
    from_validation,
)
from pydantic import ValidationError

# The versions of the API the official SDKs send (2023-06-01 is the stable one; the SDK in
# this tree's test extra sends 2026-10-21), each served as this module says.
API_VERSIONS = ("2023-01-01", "2023-06-01", "2026-10-21")


def check_headers(request: Request, ignored: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Refuse an unknown version or beta naming its header; the betas of `ignored` the request
    names (taken, doing nothing: the reply says so)."""
    version = request.headers.get("anthropic-version")
    if version is not None and version not in API_VERSIONS:
        raise OpenAIError(
            400,
            f"anthropic-version: {version!r} is not a version this server speaks; allowed: "
            + ", ".join(API_VERSIONS),
            param="anthropic-version",
        )
    asked = [b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()]
    for beta in asked:
        if beta not in BETAS and beta not in ignored:
            raise OpenAIError(
                400,
                f"anthropic-beta: {beta!r} asks for what this server does not do; allowed: "
                + ", ".join(BETAS),
                param="anthropic-beta",
            )
    return tuple(b for b in asked if b in ignored)


def add_messages_routes(app: FastAPI, doors: Doors) -> None:
    async def parse(request: Request, schema: type[ConversationBody]):
        doors.authorize(request, token=request.headers.get("x-api-key"))
        request.state.betas_ignored = check_headers(request, doors.frontend.anthropic_betas_ignored)
        try:
            body = schema.model_validate_json(await doors.body(request))
        except ValidationError as error:
            raise from_validation(error, schema) from None
        unsupported = body.unsupported()
        if unsupported is not None:
            raise from_unsupported(unsupported)
        doors.check_model(body.model)
        return body

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await parse(request, MessagesRequest)
        pb, names = messages_request_to_pb(body)
        try:
            call = await doors.route(request, pb)
        except Exception as error:
            raise from_routing(error, body, names) from None
        thinking = body.thinking
        reply = MessageReply(
            body.model,
            pb.request_id,
            show_thinking=thinking is None or thinking.display != "omitted",
            thinking_disabled=thinking is not None and thinking.type == "disabled",
        )
        said = _ignored(request)
        if body.stream:
            events = _events(reply, call, body, names)
            return StreamingResponse(events, media_type="text/event-stream", headers=said)
        try:
            async for response in call:
                reply.add(response)
        except OpenAIError:
            raise
        except Exception as error:
            raise from_routing(error, body, names) from None
        finally:
            call.end()
        return JSONResponse(reply.message(), headers=said)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        body = await parse(request, CountTokensRequest)
        pb, names = count_request_to_pb(body)
        try:
            reply = await doors.frontend.tokenizing.tokenize(pb, None)
        except Exception as error:
            raise from_routing(error, body, names) from None
        return JSONResponse({"input_tokens": len(reply.tokens)}, headers=_ignored(request))


def _ignored(request: Request) -> dict[str, str]:
    """The reply's header naming the betas taken without doing what they ask, if any."""
    ignored = request.state.betas_ignored
    return {IGNORED_HEADER: ",".join(ignored)} if ignored else {}


async def _events(
    reply: MessageReply, call: RoutedCall, body: MessagesRequest, names: Names
) -> AsyncIterator[str]:
    """The message's events; a failure after the first can only be told inside the stream: an
    `error` event, as Anthropic's API sends."""
    try:
        yield sse(reply.start())
        async for response in call:
            for event in reply.add(response):
                yield sse(event)
    except Exception as error:
        refused = error if isinstance(error, OpenAIError) else from_routing(error, body, names)
        yield sse(error_body(refused, ErrorShape.ANTHROPIC))
    finally:
        call.end()  # NOTE: also when the client went away mid-stream
