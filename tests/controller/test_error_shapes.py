"""Every error the HTTP app answers is its API's shape, chosen by the route's prefix in one place:
OpenAI's `{"error": {"message", "type", "param", "code"}}`, Anthropic's `{"type": "error",
"error": {"type", "message"}}` under /v1/messages; unknown paths (404), a path with the wrong
method (405, with `Allow`), FastAPI's request validation and an unexpected exception too, each
refusal counted as today's are. The app is driven in process (no server, no worker)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from intentserve.controller.auth import Security
from intentserve.controller.router.http.app import Frontend, build_app
from intentserve.controller.router.http.error_shapes import (
    ErrorShape,
    install_error_handlers,
    shape_of,
)
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

MODEL = "smollm2-135m"
OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest.fixture
def app() -> tuple[TestClient, CollectorRegistry]:
    registry = CollectorRegistry()
    frontend = Frontend(None, None, Security(), (MODEL,), registry, None)
    with TestClient(build_app(frontend), raise_server_exceptions=False) as client:
        yield client, registry


def openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == OPENAI_KEYS, body
    return body["error"]


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/completions", ErrorShape.OPENAI),
        ("/nowhere", ErrorShape.OPENAI),
        ("/v1/responses", ErrorShape.OPENAI),
        ("/v1/messagesx", ErrorShape.OPENAI),
        ("/v1/messages", ErrorShape.ANTHROPIC),
        ("/v1/messages/count_tokens", ErrorShape.ANTHROPIC),
    ],
)
def test_the_shape_is_chosen_by_the_route_prefix(path, shape):
    assert shape_of(path) is shape


def test_an_unknown_path_is_404_openai_shaped_naming_it(app):
    client, registry = app
    error = openai_error(client.get("/nowhere"), 404)
    assert "GET /nowhere" in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "unknown_path"
    error = openai_error(client.post("/v1/assistants", json={"model": MODEL}), 404)
    assert "POST /v1/assistants" in error["message"]
    refused = registry.get_sample_value(
        "intentserve_http_requests_refused_total", {"route": "unmatched", "status": "404"}
    )
    assert refused == 2


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("POST", "/v1/models", "GET"), ("GET", "/v1/chat/completions", "POST")],
)
def test_a_known_path_with_the_wrong_method_is_405_with_allow(app, method, path, allow):
    client, registry = app
    response = client.request(method, path)
    error = openai_error(response, 405)
    assert response.headers["allow"] == allow
    assert f"{method} {path}" in error["message"] and allow in error["message"]
    assert error["code"] == "method_not_allowed"
    refused = registry.get_sample_value(
        "intentserve_http_requests_refused_total", {"route": path, "status": "405"}
    )
    assert refused == 1


def test_a_body_that_is_not_json_is_400_openai_shaped(app):
    client, _ = app
    response = client.post("/v1/completions", content=b"not json", headers={"content-type": "x"})
    assert openai_error(response, 400)["type"] == "invalid_request_error"


def test_under_v1_messages_errors_are_anthropic_shaped(app):
    client, _ = app
    response = client.post("/v1/messages/batches", json={})
    assert response.status_code == 404
    assert response.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": response.json()["error"]["message"]},
    }
    assert "POST /v1/messages/batches" in response.json()["error"]["message"]
    bad_id = client.post("/v1/messages", headers={"x-request-id": "\x01"})
    assert bad_id.status_code == 400
    assert bad_id.json()["type"] == "error"
    assert bad_id.json()["error"]["type"] == "invalid_request_error"


def test_fastapis_own_validation_and_an_unexpected_exception_are_shaped_too():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/count")
    async def count(n: int) -> dict:
        return {"n": n}

    @app.get("/v1/messages/count")
    async def messages_count(n: int) -> dict:
        return {"n": n}

    @app.get("/v1/broken")
    async def broken() -> dict:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        error = openai_error(client.get("/v1/count", params={"n": "x"}), 400)
        assert error["param"] == "n" and error["message"].startswith("n: ")
        anthropic = client.get("/v1/messages/count", params={"n": "x"})
        assert anthropic.status_code == 400
        assert anthropic.json()["error"]["type"] == "invalid_request_error"
        error = openai_error(client.get("/v1/broken"), 500)
        assert error["type"] == "server_error" and "a bug" not in error["message"]
