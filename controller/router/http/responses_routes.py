"""OpenAI's Responses API, served through the doors every API here shares (doors.py):

    POST   /v1/responses       a Response (stream: its events, responses_reply.py), kept for
                               `previous_response_id` and GET unless `store` is false
    GET    /v1/responses/{id}  a kept Response, as it was answered
    DELETE /v1/responses/{id}  {"id", "object": "response.deleted", "deleted": true}

Responses are kept per API key (responses_store.py), the last `responses_store_size` of each; an
id that key did not keep (never, no longer, or another key's) is 404 naming the parameter.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from intentserve.controller.router.http import responses_convert
from intentserve.controller.router.http.doors import Doors, RoutedCall
from intentserve.controller.router.http.errors import OpenAIError, from_routing
from intentserve.controller.router.http.responses_reply import ResponseReply
from intentserve.controller.router.http.responses_schema import ResponsesRequest
from intentserve.controller.router.http.responses_store import (
    DEFAULT_RESPONSES_STORE_SIZE,
    ResponsesStore,
    StoredResponse,
)
from prometheus_client import Gauge

__all__ = ["DEFAULT_RESPONSES_STORE_SIZE", "add_responses_routes"]  # the size: app.Frontend's

Parse = Callable[[Request, type[ResponsesRequest]], Awaitable[ResponsesRequest]]


def add_responses_routes(app: FastAPI, doors: Doors, parse: Parse) -> None:
    """`parse`: the app's (key, body shape, refused fields, model), as for chat."""
    store = ResponsesStore(doors.frontend.responses_store_size)
    Gauge(
        "intentserve_http_responses_stored",
        "Responses kept for previous_response_id and GET /v1/responses/{id}, every key's",
        registry=doors.frontend.metrics,
    ).set_function(store.num_stored)

    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        body = await parse(request, ResponsesRequest)
        key = doors.client_key(request)
        previous = ()
        if body.previous_response_id is not None:
            previous = _stored(store, key, body.previous_response_id, "previous_response_id")
            previous = previous.conversation
        turns = responses_convert.conversation(body, previous)
        pb = responses_convert.to_pb(body, turns)

        def names(field_path: str) -> str | None:
            return responses_convert.param_of(field_path, body)

        try:
            call = await doors.route(request, pb)
        except Exception as error:
            raise from_routing(error, body, names) from None
        reply = ResponseReply(body)

        def keep() -> None:
            if body.stores:
                conversation = (*turns, reply.assistant_turn())
                store.put(key, reply.id, StoredResponse(reply.response(), conversation))

        if body.stream:
            return StreamingResponse(
                _events(reply, call, lambda error: from_routing(error, body, names), keep),
                media_type="text/event-stream",
            )
        try:
            async for response in call:
                reply.add(response)
        except Exception as error:
            raise from_routing(error, body, names) from None
        finally:
            call.end()
        reply.finish()
        keep()
        return JSONResponse(reply.response())

    @app.get("/v1/responses/{response_id}")
    async def retrieve(request: Request, response_id: str) -> dict[str, Any]:
        doors.authorize(request)
        _no_query(request)
        return _stored(store, doors.client_key(request), response_id, "response_id").response

    @app.delete("/v1/responses/{response_id}")
    async def delete(request: Request, response_id: str) -> dict[str, Any]:
        doors.authorize(request)
        _no_query(request)
        if not store.delete(doors.client_key(request), response_id):
            raise _not_stored(response_id, "response_id")
        return {"id": response_id, "object": "response.deleted", "deleted": True}


def _stored(store: ResponsesStore, key: str | None, response_id: str, param: str):
    stored = store.get(key, response_id)
    if stored is None:
        raise _not_stored(response_id, param)
    return stored


def _not_stored(response_id: str, param: str) -> OpenAIError:
    message = (
        f"{param}: no response {response_id!r} is kept for this API key (never stored, "
        "stored with store: false, deleted, or past the store's size)"
    )
    return OpenAIError(404, message, param=param, code="response_not_found")


def _no_query(request: Request) -> None:
    """GET and DELETE take no query parameters here (a kept response is never streamed again,
    nor anything added to it)."""
    for name in request.query_params:
        message = f"{name}: not honoured by this server, so refused"
        raise OpenAIError(400, message, param=name)


def _sse(event: dict[str, Any]) -> str:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n"


async def _events(
    reply: ResponseReply,
    call: RoutedCall,
    refused: Callable[[Exception], OpenAIError],
    keep: Callable[[], None],
) -> AsyncIterator[str]:
    """The response's events; it is kept once completed. A failure after the first event can
    only be told inside the stream: an `error` event, then `response.failed`, as OpenAI's."""
    try:
        for event in reply.start():
            yield _sse(event)
        async for response in call:
            for event in reply.add(response):
                yield _sse(event)
        events = reply.finish()
        keep()
    except Exception as error:
        events = reply.failed(refused(error).body()["error"])
    finally:
        call.end()  # NOTE: also when the client went away mid-stream
    for event in events:
        yield _sse(event)
