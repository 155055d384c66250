"""The OpenAI-compatible HTTP API, `/health` and `/metrics`, served from a router's parts: the
same readiness as its gRPC health, the same (metered) router and its admission, the same API
keys.

    GET  /v1/models             the deployment's model, by its served name, with its
                                max_model_len and what each worker realized
    GET  /version               intentserve's version
    POST /v1/completions        OpenAI's completions (stream: server-sent events, then [DONE])
    POST /v1/chat/completions   OpenAI's chat completions; the worker templates every turn
    POST /tokenize, /detokenize vLLM's: a READY worker's tokenizer (tokenize.py)
    GET  /health                200 when gRPC health says SERVING, else 503 with the reason
    GET  /metrics               Prometheus text format

`/v1/*`, `/tokenize` and `/detokenize` need an API key (`Authorization: Bearer ...`) when keys
are set; `/health` and `/metrics` are open, like gRPC health. Every request gets a request id and
an access-log line (access.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from intentserve import __version__
from intentserve.controller.auth import Security
from intentserve.controller.router.http import openai_convert
from intentserve.controller.router.http.access import AccessLog, refused_requests
from intentserve.controller.router.http.anthropic_routes import add_messages_routes
from intentserve.controller.router.http.cors import allow_origins
from intentserve.controller.router.http.doors import MAX_BODY_BYTES, Doors, RoutedCall
from intentserve.controller.router.http.embeddings import add_embeddings_route
from intentserve.controller.router.http.error_shapes import install_error_handlers
from intentserve.controller.router.http.errors import (
    from_routing,
    from_unsupported,
    from_validation,
)
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_reply import Reply, merged_response, merged_usage
from intentserve.controller.router.http.openai_schema import CompletionRequest
from intentserve.controller.router.http.responses_routes import (
    DEFAULT_RESPONSES_STORE_SIZE,
    add_responses_routes,
)
from intentserve.controller.router.http.tokenize import add_tokenize_routes
from intentserve.controller.router.request_metrics import MeteredRouter
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.controller.router.view import DeploymentView
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError

__all__ = ["MAX_BODY_BYTES", "Frontend", "build_app"]  # the body's bound: doors.py


@dataclass(frozen=True)
class Frontend:
    """What the HTTP API serves from: the controller's own parts."""

    router: MeteredRouter
    view: DeploymentView  # readiness as gRPC health says it, and what the workers realized
    security: Security
    # What a request's `model` may be: the served name (listed), then the exact reference.
    model_names: tuple[str, ...]
    metrics: CollectorRegistry
    tokenizing: TokenizeRoute  # /tokenize, /detokenize on a READY worker
    cors_origins: tuple[str, ...] = ()  # browser origins allowed cross-origin; none: off
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE  # kept per API key (/v1/responses)
    anthropic_betas_ignored: tuple[str, ...] = ()  # taken, doing nothing, said back (Messages)


def _json(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else _json(data)}\n\n"


def build_app(frontend: Frontend) -> FastAPI:
    app = FastAPI(title="intentserve", docs_url=None, redoc_url=None, openapi_url=None)
    allow_origins(app, frontend.cors_origins)
    # Added last, so outermost: every request gets its access-log line, CORS preflights too.
    app.add_middleware(AccessLog, refused=refused_requests(frontend.metrics))

    install_error_handlers(app)

    doors = Doors(frontend)
    authorize = doors.authorize

    async def parse(request: Request, schema):
        authorize(request)
        try:
            body = schema.model_validate_json(await doors.body(request))
        except ValidationError as error:
            raise from_validation(error, schema) from None
        unsupported = body.unsupported()
        if unsupported is not None:
            raise from_unsupported(unsupported)
        doors.check_model(body.model)
        return body

    add_tokenize_routes(app, frontend.tokenizing, parse)
    add_embeddings_route(app, frontend.tokenizing, parse)
    add_messages_routes(app, doors)
    add_responses_routes(app, doors, parse)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        realized = frontend.view.realized()
        model = {
            "id": frontend.model_names[0],
            "object": "model",
            "created": 0,
            "owned_by": "intentserve",
            # The smallest of the workers' (a request must fit whichever serves it); None
            # until one has realized its cache.
            "max_model_len": min((r.max_model_len for r in realized), default=None),
            "realized": [r.labels for r in realized],
        }
        return {"object": "list", "data": [model]}

    @app.get("/version")
    async def version(request: Request) -> dict:
        authorize(request)
        return {"version": __version__}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse(request, CompletionRequest)
        return await generate(request, body, openai_convert.completion_request_to_pb(body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse(request, ChatCompletionRequest)
        return await generate(request, body, openai_convert.chat_request_to_pb(body))

    async def generate(request: Request, body, pb) -> Response:
        try:
            call = await doors.route(request, pb)
        except Exception as error:
            raise from_routing(error, body) from None
        chat, with_logprobs = (
            isinstance(body, ChatCompletionRequest),
            pb.sampling.HasField("logprobs"),
        )
        replies = [
            Reply(
                chat,
                body.model,
                pb.request_id,
                index=i,
                with_logprobs=with_logprobs,
                echo=bool(getattr(body, "echo", False)),
                echo_text=getattr(body, "prompt_text", None),
            )
            for i in range(pb.n or 1)
        ]
        if body.stream:
            events = _events(replies, call, body.include_usage, body)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            async for response in call:
                replies[response.index].add(response)
        except Exception as error:
            raise from_routing(error, body) from None
        finally:
            call.end()
        return JSONResponse(merged_response(replies))

    @app.get("/health")
    async def health() -> Response:
        health = frontend.view.health()
        reason = health.reason
        data = {
            "status": "serving" if health.serving else "not_serving",
            "state": health.state,
            "reason": {"code": reason.code.value, "message": reason.message},
        }
        return JSONResponse(data, status_code=200 if health.serving else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(frontend.metrics), media_type=CONTENT_TYPE_LATEST)

    return app


async def _events(
    replies: list[Reply], call: RoutedCall, include_usage: bool, body
) -> AsyncIterator[str]:
    """OpenAI's chunks as server-sent events, then `data: [DONE]`. A failure after the first
    chunk can only be told inside the stream: an `error` event, as vLLM sends."""
    extra = {"usage": None} if include_usage else {}
    try:
        for reply in replies:
            if reply.chat:
                yield _sse(reply.chunk("", None, first=True, **extra))
        async for response in call:
            reply = replies[response.index]
            text, finish = reply.add(response)
            pending = reply.logprobs or reply.has_unsent_calls or reply.unsent_reasoning
            if text or finish is not None or pending:
                yield _sse(reply.chunk(text, finish, **extra))
        if include_usage:
            yield _sse({**replies[0].usage_chunk(), "usage": merged_usage(replies)})
    except Exception as error:
        yield _sse(from_routing(error, body).body())
    finally:
        call.end()  # NOTE: also when the client went away mid-stream
    yield _sse("[DONE]")
