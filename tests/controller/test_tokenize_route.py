"""`/tokenize`, `/detokenize` and the controller's gRPC Tokenize on a real controller with a
scripted worker (one token a character): routed to a READY worker, behind the API key; not ready
is 503 with the reason; a worker's refusal names the field (its BadRequest detail)."""

from __future__ import annotations

import grpc
import httpx2 as httpx
import pytest
from intentserve.common.field_errors import violation_of
from intentserve.policy import ReasonCode, examples
from intentserve.v1 import inference_pb2

from tests.controller.conftest import eventually
from tests.controller.scripted_worker import TOKENIZE_REFUSAL, Behaviour

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
KEY = "tok-key"
AUTH = (("authorization", f"Bearer {KEY}"),)


def ready(start_controller, make_worker, tmp_path, **worker_kwargs):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    server, client = start_controller(http_port=0, paged_attention="on", api_keys_file=str(keys))
    worker = make_worker(server, "w0", examples.cpu(), **worker_kwargs)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    return server, client


def post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.http_url}{path}", json=body, headers=headers, timeout=10)


def test_tokenize_and_detokenize_reach_a_ready_worker(start_controller, make_worker, tmp_path):
    server, client = ready(start_controller, make_worker, tmp_path)
    tokenized = post(
        server, "/tokenize", {"model": MODEL, "prompt": "Hi", "return_token_strs": False}
    )
    assert tokenized.json() == {
        "count": 2,
        "max_model_len": 64,
        "tokens": [ord("H"), ord("i")],
        "token_strs": None,
    }
    chat = post(
        server, "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "ab"}]}
    )
    assert chat.json()["tokens"] == [97, 98]
    assert post(server, "/detokenize", {"model": MODEL, "tokens": [72, 105]}).json() == {
        "prompt": "Hi"
    }
    assert post(server, "/tokenize", {"model": MODEL, "prompt": "Hi"}, key=None).status_code == 401
    request = inference_pb2.TokenizeRequest(prompt="Hi")
    reply = client.inference.Tokenize(
        request, timeout=10, metadata=(("authorization", f"Bearer {KEY}"),)
    )
    assert list(reply.tokens) == [72, 105]


def test_not_ready_is_503_with_the_reason(start_controller):
    server, client = start_controller(http_port=0, paged_attention="on")
    refused = post(server, "/tokenize", {"model": MODEL, "prompt": "Hi"})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == ReasonCode.NOT_ENOUGH_REPLICAS.value
    with pytest.raises(grpc.RpcError) as info:
        client.inference.Detokenize(inference_pb2.DetokenizeRequest(tokens=[1]), timeout=10)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_workers_refusal_names_the_field(start_controller, make_worker, tmp_path):
    server, client = ready(start_controller, make_worker, tmp_path, behaviour=Behaviour.INVALID)
    with pytest.raises(grpc.RpcError) as info:
        client.inference.Tokenize(
            inference_pb2.TokenizeRequest(prompt="Hi"),
            timeout=10,
            metadata=AUTH,
        )
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert violation_of(info.value) == TOKENIZE_REFUSAL
    refused = post(server, "/tokenize", {"model": MODEL, "prompt": "Hi"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "prompt"
    assert refused.json()["error"]["message"] == "prompt: makes no tokens"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": "a", "messages": []}, "messages"),
        ({"model": MODEL, "prompt": "a", "tools": []}, "tools"),
        ({"model": MODEL, "prompt": "a", "add_generation_prompt": False}, "add_generation_prompt"),
        ({"model": "other", "prompt": "a"}, "model"),
    ],
)
def test_a_body_that_asks_for_what_is_not_done_is_refused_naming_it(start_controller, body, param):
    server, _ = start_controller(http_port=0, paged_attention="on")
    refused = post(server, "/tokenize", body, key=None)
    assert refused.json()["error"]["param"] == param, refused.text
