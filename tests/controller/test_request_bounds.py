"""Every route is bounded before a worker renders or tokenizes anything: the HTTP app's routes are
walked (a new route is walked too) with deep nesting and oversize bodies, and each is refused
with a 4xx in OpenAI's error shape naming a field, never a 500; the gRPC front door refuses the
same sizes with INVALID_ARGUMENT naming the field. A real controller with a scripted worker that
realized a max_model_len of 64 tokens."""

from __future__ import annotations

import dataclasses
import json

import grpc
import httpx2 as httpx
import pytest
from fastapi.routing import APIRoute
from intentserve.common.field_errors import violation_of
from intentserve.controller.auth import Security
from intentserve.controller.router.http.anthropic_schema import CountTokensRequest, MessagesRequest
from intentserve.controller.router.http.app import MAX_BODY_BYTES, Frontend, build_app
from intentserve.controller.router.http.embeddings import MAX_INPUTS, EmbeddingsRequest
from intentserve.controller.router.http.error_shapes import ErrorShape, shape_of
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_schema import CompletionRequest
from intentserve.controller.router.http.responses_schema import ResponsesRequest
from intentserve.controller.router.http.tokenize import DetokenizeRequest, TokenizeRequest
from intentserve.controller.router.nesting import MAX_JSON_DEPTH
from intentserve.controller.router.request_size import MAX_MESSAGES, MAX_TOKEN_CHARS, MAX_TOOLS
from intentserve.policy import examples
from intentserve.v1 import inference_pb2
from prometheus_client import CollectorRegistry

from tests.controller.conftest import eventually

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 64
MAX_CHARS = MAX_MODEL_LEN * MAX_TOKEN_CHARS
HI = [{"role": "user", "content": "Hi"}]
DEEPEST = 26_000  # past every parser's own limit (the body's: 200 levels)


def nested(depth: int) -> str:
    """JSON text of `depth` levels of objects."""
    return '{"a":' * depth + "1" + "}" * depth


def body_with(fields: dict, raw: dict[str, str] | None = None) -> bytes:
    """A JSON body of `fields`, and fields given as raw JSON text (nested deeper than Python's
    json writes)."""
    text = json.dumps(fields)
    for name, value in (raw or {}).items():
        text = text[:-1] + f', "{name}": {value}' + "}"
    return text.encode()


def tool_with(parameters: str) -> str:
    return '[{"type": "function", "function": {"name": "f", "parameters": ' + parameters + "}}]"


OVER = nested(MAX_JSON_DEPTH + 1)
CHAT = {"model": MODEL, "messages": HI, "max_tokens": 8}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 8}
RESPONSE = {"model": MODEL, "input": "Hi", "max_output_tokens": 8}
FUNCTION = {"type": "function", "name": "f", "parameters": {}}
MESSAGE = {"model": MODEL, "messages": HI, "max_tokens": 8}
COUNT = {"model": MODEL, "messages": HI}
EMBED = {"model": MODEL, "input": "Hi"}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}


def anthropic_cases(valid: dict) -> list[tuple[bytes, str]]:
    """Anthropic's Messages and count_tokens: the conversation's bounds, named by the body's
    own paths (Anthropic's errors have no `param`: the message starts with it)."""
    return [
        (body_with({**valid, "messages": HI * (MAX_MESSAGES + 1)}), "messages"),
        (body_with({**valid, "tools": [ANTHROPIC_TOOL] * (MAX_TOOLS + 1)}), "tools"),
    ]


RESPONSE_CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": OVER}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": OVER}}
# Each POST route: its body's schema, a valid body, and its own cases (body, the param named).
ROUTES = {
    "/v1/chat/completions": (
        ChatCompletionRequest,
        CHAT,
        [
            (body_with({**CHAT, "messages": HI * (MAX_MESSAGES + 1)}), "messages"),
            (
                body_with({**CHAT, "messages": [{"role": "user", "content": "a" * MAX_CHARS}] * 2}),
                "messages",
            ),
            (body_with({**CHAT, "tools": json.loads(tool_with("{}")) * (MAX_TOOLS + 1)}), "tools"),
            (body_with(CHAT, {"tools": tool_with(OVER)}), "tools[0].function.parameters"),
            (
                body_with(CHAT, {"tools": tool_with(nested(DEEPEST))}),
                "tools[0].function.parameters",
            ),
            (
                body_with({**CHAT, "messages": [*HI, {"role": "assistant", "tool_calls": [CALL]}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                body_with(CHAT, {"chat_template_kwargs": nested(MAX_JSON_DEPTH + 2)}),
                "chat_template_kwargs",
            ),
            (body_with(CHAT, {"chat_template_kwargs": nested(DEEPEST)}), "chat_template_kwargs"),
            (
                body_with(CHAT, {"structured_outputs": '{"json": ' + OVER + "}"}),
                "structured_outputs",
            ),
            (
                body_with(CHAT, {"structured_outputs": '{"json": ' + nested(DEEPEST) + "}"}),
                "structured_outputs.json",
            ),
            (
                body_with({**CHAT, "structured_outputs": {"json": nested(DEEPEST)}}),
                "structured_outputs",
            ),
            (
                body_with(
                    CHAT,
                    {
                        "response_format": '{"type": "json_schema", "json_schema": '
                        '{"name": "x", "schema": ' + OVER + "}}"
                    },
                ),
                "response_format",
            ),
        ],
    ),
    "/v1/completions": (
        CompletionRequest,
        COMPLETION,
        [
            (body_with({**COMPLETION, "prompt": "a" * (MAX_CHARS + 1)}), "prompt"),
            (body_with({**COMPLETION, "structured_outputs": {"json": OVER}}), "structured_outputs"),
            (
                body_with(COMPLETION, {"structured_outputs": '{"json": ' + nested(DEEPEST) + "}"}),
                "structured_outputs.json",
            ),
        ],
    ),
    "/tokenize": (
        TokenizeRequest,
        {"model": MODEL, "prompt": "Hi"},
        [
            (body_with({"model": MODEL, "prompt": "a" * (MAX_CHARS + 1)}), "prompt"),
            (body_with({"model": MODEL, "messages": HI * (MAX_MESSAGES + 1)}), "messages"),
            (
                body_with({"model": MODEL, "messages": HI}, {"tools": tool_with(OVER)}),
                "tools[0].function.parameters",
            ),
            (
                body_with(
                    {"model": MODEL, "messages": HI},
                    {"chat_template_kwargs": nested(MAX_JSON_DEPTH + 2)},
                ),
                "chat_template_kwargs",
            ),
        ],
    ),
    "/detokenize": (
        DetokenizeRequest,
        {"model": MODEL, "tokens": [72]},
        [(body_with({"model": MODEL, "tokens": [72] * (MAX_MODEL_LEN + 1)}), "tokens")],
    ),
    "/v1/responses": (
        ResponsesRequest,
        RESPONSE,
        [
            (body_with({**RESPONSE, "input": HI * (MAX_MESSAGES + 1)}), "input"),
            (body_with({**RESPONSE, "input": "a" * (MAX_CHARS + 1)}), "input"),
            (body_with({**RESPONSE, "tools": [FUNCTION] * (MAX_TOOLS + 1)}), "tools"),
            (
                body_with(
                    RESPONSE,
                    {"tools": '[{"type": "function", "name": "f", "parameters": ' + OVER + "}]"},
                ),
                "tools[0].parameters",
            ),
            (
                body_with(
                    RESPONSE,
                    {
                        "tools": '[{"type": "function", "name": "f", "parameters": '
                        + nested(DEEPEST)
                        + "}]"
                    },
                ),
                "tools",
            ),
            (
                body_with(
                    RESPONSE,
                    {
                        "text": '{"format": {"type": "json_schema", "name": "x", "schema": '
                        + OVER
                        + "}}"
                    },
                ),
                "text.format",
            ),
            (body_with({**RESPONSE, "input": [*HI, RESPONSE_CALL]}), "input"),
        ],
    ),
    "/v1/messages": (MessagesRequest, MESSAGE, anthropic_cases(MESSAGE)),
    "/v1/messages/count_tokens": (CountTokensRequest, COUNT, anthropic_cases(COUNT)),
    "/v1/embeddings": (
        EmbeddingsRequest,
        EMBED,
        [
            (body_with({**EMBED, "input": ["Hi"] * (MAX_INPUTS + 1)}), "input"),
            (body_with({**EMBED, "input": [[72]] * (MAX_INPUTS + 1)}), "input"),
            (body_with({**EMBED, "input": []}), "input"),
        ],
    ),
}


def post(http: httpx.Client, path: str, content: bytes) -> httpx.Response:
    return send(http, "POST", path, content)


def send(http: httpx.Client, method: str, path: str, content: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return http.request(method, path, content=content, headers=headers, timeout=30)


def served_routes() -> list[APIRoute]:
    """The routes the HTTP API serves (build_app's, whatever parts it is given)."""
    frontend = Frontend(None, None, Security(), (MODEL,), CollectorRegistry(), None)
    return [r for r in build_app(frontend).routes if isinstance(r, APIRoute)]


@pytest.fixture
def served(start_controller, make_worker):
    server, client = start_controller(http_port=0, paged_attention="on")
    worker = make_worker(server, "w0", examples.cpu())
    worker.register()
    worker.start_heartbeats()
    realized = dataclasses.replace(worker.matching_realized(), max_model_len=MAX_MODEL_LEN)
    assert worker.report(realized).verified
    eventually(lambda: server.verdict().ready, what="READY")
    with httpx.Client(base_url=server.http_url) as http:
        yield http, client, worker


def assert_refused(response: httpx.Response, param: str | None) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    if shape_of(response.request.url.path) is ErrorShape.ANTHROPIC:
        assert response.json()["type"] == "error" and set(error) == {"type", "message"}, error
    else:
        assert set(error) == {"message", "type", "param", "code"}
        if param is not None:
            assert error["param"] == param, error
    if param is not None:
        assert error["message"].startswith(f"{param}: "), error


def generic_cases(valid: dict) -> list[tuple[bytes, str | None]]:
    """What every route gets, whatever its schema (`valid`: a body it serves)."""
    return [
        (body_with(valid, {"nesting": nested(MAX_JSON_DEPTH + 8)}), "nesting"),
        (body_with(valid, {"nesting": nested(DEEPEST)}), "nesting"),
        (
            body_with({k: v for k, v in valid.items() if k != "model"}, {"model": nested(DEEPEST)}),
            "model",
        ),
        (b'{"model": "' + b"x" * MAX_BODY_BYTES + b'"}', None),  # 413, before it is read
    ]


def test_every_route_is_walked_and_every_post_route_has_its_cases():
    posts = {r.path for r in served_routes() if "POST" in r.methods}
    assert posts == set(ROUTES), "a new route needs its own cases here"


def test_every_route_refuses_deep_and_oversize_bodies_by_name(served):
    http, _, worker = served
    for route in served_routes():
        valid = ROUTES[route.path][1] if route.path in ROUTES else {"model": MODEL}
        for content, param in generic_cases(valid):
            for method in route.methods:
                response = send(http, method, route.path, content)
                assert response.status_code != 500, (route.path, response.text[:300])
                if method == "POST":
                    assert_refused(response, param)
    assert worker.num_requests == 0


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_each_post_routes_own_bounds_are_refused_by_name(served, path):
    http, _, worker = served
    for content, param in ROUTES[path][2]:
        assert_refused(post(http, path, content), param)
    assert worker.num_requests == 0


def accepts(schema: type, body: dict) -> bool:
    try:
        schema.model_validate(body)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_a_known_field_of_the_wrong_type_is_refused_naming_it(served, path):
    http, _, _ = served
    schema, valid, _ = ROUTES[path]
    for name in schema.model_fields:
        for wrong in ({"wrong": [1]}, "wrong"):
            if accepts(schema, {**valid, name: wrong}):
                continue  # not of the wrong type for this field (embeddings' input is a text)
            response = post(http, path, body_with({**valid, name: wrong}))
            assert response.status_code != 500, (name, response.text[:300])
            if response.status_code == 400:
                error = response.json()["error"]
                named = error.get("param") or error["message"]  # Anthropic's: in the message
                assert named.startswith(name), response.text


def test_a_valid_request_at_the_bounds_is_served(served):
    http, _, worker = served
    at_bound = {**CHAT, "messages": [{"role": "user", "content": "a" * MAX_CHARS}]}
    response = post(http, "/v1/chat/completions", body_with(at_bound))
    assert response.status_code == 200, response.text
    assert post(http, "/detokenize", body_with(ROUTES["/detokenize"][1])).status_code == 200
    assert worker.num_requests == 1


def refused_field(call) -> str:
    """The field a gRPC call's INVALID_ARGUMENT names (its BadRequest detail)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return violation_of(info.value).field


def test_the_grpc_front_door_refuses_the_same_bounds_by_name(served):
    _, client, worker = served
    turn = inference_pb2.ChatMessage(role="user", content="Hi")
    stub = client.inference

    def generate(**fields):
        return lambda: list(stub.Generate(inference_pb2.GenerateRequest(**fields), timeout=10))

    assert refused_field(generate(messages=[turn] * (MAX_MESSAGES + 1))) == "messages"
    assert refused_field(generate(prompt="a" * (MAX_CHARS + 1))) == "prompt"
    schema = inference_pb2.OutputConstraint(json_schema=nested(DEEPEST))
    sampling = inference_pb2.SamplingParams(constraint=schema)
    assert refused_field(generate(prompt="Hi", sampling=sampling)) == (
        "sampling.constraint.json_schema"
    )
    tokenize = inference_pb2.TokenizeRequest(prompt="a" * (MAX_CHARS + 1))
    assert refused_field(lambda: stub.Tokenize(tokenize, timeout=10)) == "prompt"
    detokenize = inference_pb2.DetokenizeRequest(tokens=[72] * (MAX_MODEL_LEN + 1))
    assert refused_field(lambda: stub.Detokenize(detokenize, timeout=10)) == "tokens"
    assert worker.num_requests == 0


def test_a_detokenize_whose_reply_is_over_the_message_limit_is_400_naming_tokens(
    start_controller, make_worker
):
    """Found by review: 10^6 ids came back as 429 (the reply was over the router's 4 MiB
    message limit), which invites a retry of the same request."""
    server, _ = start_controller(http_port=0, paged_attention="on")
    worker = make_worker(server, "w0", examples.cpu())  # it reports no max_model_len
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    tokens = [0x10000] * 1_100_000  # 4 bytes of UTF-8 each: a 4.4 MB reply
    body = body_with({"model": MODEL, "tokens": tokens})
    with httpx.Client(base_url=server.http_url) as http:
        response = post(http, "/detokenize", body)
    assert_refused(response, "tokens")
    assert response.status_code == 400
