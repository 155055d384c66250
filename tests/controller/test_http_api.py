"""The HTTP API of a real controller with scripted workers, through the official `openai` client
and plain HTTP: readiness, keys, models, admission, disconnects; `/metrics` parsed with
prometheus_client's parser against `status --json`."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import httpx2 as httpx
import openai
import pytest
from intentserve.client import ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.controller.router.http.app import MAX_BODY_BYTES
from intentserve.policy import Reason, ReasonCode, examples
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.conftest import DEPLOYMENT, eventually
from tests.controller.scripted_worker import HONEST_WEIGHT_BYTES, PLAY_THREAD, Behaviour

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
CPU = examples.cpu()
BERT = examples.cpu(model=examples.BERT)
HI = [{"role": "user", "content": "Hi"}]


def client_for(server, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.http_url}/v1", api_key=api_key, max_retries=0, timeout=10
    )


def metrics(server) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of /metrics by its name: [(labels, value)]."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=5).text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def sample(server, name: str, **labels) -> float:
    found = [v for got, v in metrics(server).get(name, []) if labels.items() <= got.items()]
    return sum(found)


def ready_controller(start_controller, make_worker, **settings):
    server, _ = start_controller(http_port=0, paged_attention="on", **settings)
    worker = make_worker(server, "w0", CPU)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    return server, worker


def test_not_ready_is_503_with_the_readiness_reason(start_controller):
    server, _ = start_controller(http_port=0, paged_attention="on")
    health = httpx.get(f"{server.http_url}/health", timeout=5)
    assert health.status_code == 503
    assert health.json()["reason"]["code"] == ReasonCode.NOT_ENOUGH_REPLICAS.value
    with client_for(server) as client, pytest.raises(openai.InternalServerError) as error:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4)
    assert error.value.status_code == 503
    assert error.value.body["code"] == ReasonCode.NOT_ENOUGH_REPLICAS.value
    assert "0 of 1 required replicas verified" in error.value.body["message"]


def test_models_completions_and_chat_when_ready(start_controller, make_worker):
    server, worker = ready_controller(start_controller, make_worker)
    assert httpx.get(f"{server.http_url}/health", timeout=5).status_code == 200
    with client_for(server) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        done = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
        assert done.choices[0].text == "t0 t1 t2 " and done.choices[0].finish_reason == "length"
        assert done.usage.completion_tokens == 3
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ]
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
            )
        )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "t0 t1 t2 "
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    sent = worker.requests[-1]
    assert [(m.role, m.content) for m in sent.messages] == [
        (m["role"], m["content"]) for m in messages
    ]


def test_an_unknown_model_is_404_and_a_refused_field_400(start_controller, make_worker):
    server, _ = ready_controller(start_controller, make_worker)
    with client_for(server) as client:
        with pytest.raises(openai.NotFoundError) as error:
            client.completions.create(model="gpt-4", prompt="Hi")
        assert error.value.body["param"] == "model"
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt="Hi", suffix="end")
        assert error.value.body["param"] == "suffix"
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt="Hi", extra_body={"frobnicate": 1})
        assert error.value.body["param"] == "frobnicate"


def test_n_choices_are_one_request_merged_whole_and_streamed(start_controller, make_worker):
    server, worker = ready_controller(start_controller, make_worker)
    with client_for(server) as client:
        done = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, n=3, seed=4)
        assert [c.index for c in done.choices] == [0, 1, 2]
        assert all(c.text == "t0 t1 t2 " for c in done.choices)
        assert done.usage.completion_tokens == 9 and done.usage.prompt_tokens == 5
        assert worker.num_requests == 1  # the worker forks the choices
        assert (worker.requests[-1].n, worker.requests[-1].sampling.seed) == (3, 4)
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                n=2,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == "t0 t1 t2 "
        assert mine[-1].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == 5  # the prompt once, as OpenAI counts it
    assert worker.num_requests == 2 and worker.requests[-1].n == 2
    eventually(lambda: server.deployment.registry.get("w0").num_outstanding == 0, what="released")


def test_the_served_name_and_the_exact_reference_are_both_accepted(start_controller, make_worker):
    server, _ = ready_controller(start_controller, make_worker, served_name="smol")
    with client_for(server) as client:
        assert [m.id for m in client.models.list()] == ["smol"]
        for name in ("smol", MODEL):
            done = client.completions.create(model=name, prompt="Hi", max_tokens=2)
            assert done.model == name
        with pytest.raises(openai.NotFoundError) as error:
            client.completions.create(model="gpt-4", prompt="Hi")
    assert "serves 'smol' or 'smollm2-135m'" in error.value.body["message"]


def test_refusals_before_routing_are_counted_by_route_and_status(
    start_controller, make_worker, tmp_path
):
    (tmp_path / "keys").write_text("the-key\n")
    server, _ = ready_controller(
        start_controller, make_worker, api_keys_file=str(tmp_path / "keys")
    )
    url = f"{server.http_url}/v1/completions"
    key = {"Authorization": "Bearer the-key"}
    assert httpx.post(url, json={"model": MODEL}, timeout=5).status_code == 401
    assert httpx.post(url, json={"model": "x", "prompt": "a"}, headers=key).status_code == 404
    assert httpx.post(url, json={"model": MODEL, "n": 0}, headers=key).status_code == 400
    assert httpx.get(f"{server.http_url}/nowhere", timeout=5).status_code == 404
    ok = httpx.post(url, json={"model": MODEL, "prompt": "a", "max_tokens": 2}, headers=key)
    assert ok.status_code == 200
    refused = "intentserve_http_requests_refused_total"
    for status in ("401", "404", "400"):
        assert sample(server, refused, route="/v1/completions", status=status) == 1
    assert sample(server, refused, route="unmatched", status="404") == 1
    assert sample(server, refused, status="200") == 0


def test_every_error_is_openai_shaped_also_for_unknown_paths_and_methods(
    start_controller, make_worker
):
    """Issue 53 item 6: FastAPI's own `{"detail": "Not Found"}` was what /v1/responses got."""
    server, _ = ready_controller(start_controller, make_worker)
    with client_for(server) as client, pytest.raises(openai.NotFoundError) as error:
        client.responses.input_items.list("resp_1")  # served: /v1/responses and /{id} only
    assert error.value.body["type"] == "invalid_request_error"
    assert "GET /v1/responses/resp_1/input_items" in error.value.body["message"]
    cases = [
        ("GET", "/nowhere", None, 404),
        ("POST", "/v1/models", None, 405),
        ("GET", "/v1/chat/completions", None, 405),
        ("POST", "/v1/chat/completions", b"{not json", 400),
    ]
    for method, path, content, status in cases:
        response = httpx.request(method, f"{server.http_url}{path}", content=content, timeout=5)
        assert response.status_code == status, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.post(f"{server.http_url}/v1/models", timeout=5).headers["allow"] == "GET"
    refused = "intentserve_http_requests_refused_total"
    assert sample(server, refused, route="unmatched", status="404") == 2
    assert sample(server, refused, route="/v1/models", status="405") == 2


def test_a_decoder_deployment_asked_for_embeddings_refuses_naming_the_model(
    start_controller, make_worker
):
    server, _ = ready_controller(start_controller, make_worker)
    with client_for(server) as client, pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input="Hi", encoding_format="float")
    body = error.value.body
    assert (body["param"], body["code"]) == ("model", "wrong_task")
    assert "serves completions (task generate), not embeddings (task embed)" in body["message"]


def test_the_request_id_is_the_clients_or_a_new_one_and_is_echoed(start_controller, make_worker):
    server, _ = ready_controller(start_controller, make_worker)
    url = f"{server.http_url}/v1/completions"
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    given = httpx.post(url, json=body, headers={"X-Request-Id": "trace-42"}, timeout=5)
    assert given.headers["x-request-id"] == "trace-42"
    assert given.json()["id"] == "cmpl-trace-42"
    made = httpx.post(url, json=body, timeout=5)
    assert made.headers["x-request-id"].startswith("req-")
    bad = httpx.post(url, json=body, headers={"X-Request-Id": "x" * 300}, timeout=5)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "X-Request-Id"


def test_with_api_keys_a_key_is_needed(start_controller, make_worker, tmp_path):
    (tmp_path / "keys").write_text("the-key\n")
    server, _ = ready_controller(
        start_controller, make_worker, api_keys_file=str(tmp_path / "keys")
    )
    with client_for(server, "wrong") as client, pytest.raises(openai.AuthenticationError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    with client_for(server, "the-key") as client:
        assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
    # Probes and scrapers need no key.
    assert httpx.get(f"{server.http_url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{server.http_url}/metrics", timeout=5).status_code == 200


def test_a_full_queue_is_429(start_controller, make_worker):
    server, _ = start_controller(
        http_port=0, paged_attention="on", max_outstanding_per_worker=1, max_queued=0
    )
    blocking = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert blocking.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    with client_for(server) as client:
        # NOTE: a blocking worker sends one token without text: only chat's first chunk shows.
        stream = client.chat.completions.create(model=MODEL, messages=HI, stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model=MODEL, prompt="Hi")
        assert error.value.body["code"] == "resource_exhausted"
        stream.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_its_request(start_controller, make_worker, stream):
    server, _ = start_controller(http_port=0, paged_attention="on")
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    body = {"model": MODEL, "messages": HI, "stream": stream}
    url = f"{server.http_url}/v1/chat/completions"
    if stream:
        with httpx.stream("POST", url, json=body, timeout=10) as response:
            assert next(response.iter_lines()).startswith("data: ")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, timeout=1.0)
    assert worker.cancelled.wait(5), "the cancel never reached the worker"
    eventually(lambda: server.deployment.registry.get("w0").num_outstanding == 0, what="released")
    eventually(
        lambda: sample(server, "intentserve_requests_total", status="cancelled") == 1,
        what="counted as cancelled",
    )


def test_streams_in_flight_take_no_thread_each(start_controller, make_worker):
    # The router runs on the HTTP server's loop: eight open streams add no thread per stream
    # (the bridge ran each request on a thread of its own before, woken per token).
    server, _ = start_controller(http_port=0, paged_attention="on", max_outstanding_per_worker=8)
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    url = f"{server.http_url}/v1/chat/completions"
    body = {"model": MODEL, "messages": HI, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=10) as response:  # the first one makes
        assert next(response.iter_lines()).startswith("data: ")  # the loop's worker channel
    eventually(lambda: len(worker.cancelled_ids) == 1, what="the first stream cancelled")

    def controller_threads() -> int:  # this process's, less the scripted worker's own
        return sum(not t.name.startswith(PLAY_THREAD) for t in threading.enumerate())

    before = controller_threads()
    with contextlib.ExitStack() as streams:
        lines = []  # NOTE: kept: httpx closes a response when its line iterator is collected
        for _ in range(8):
            response = streams.enter_context(httpx.stream("POST", url, json=body, timeout=10))
            lines.append(response.iter_lines())
            assert next(lines[-1]).startswith("data: ")
        assert len(worker.requests) == 9 and len(worker.cancelled_ids) == 1  # all 8 open
        assert controller_threads() - before <= 1
    eventually(lambda: len(worker.cancelled_ids) == 9, what="the 8 streams cancelled")


def test_counters_move_by_the_requests_and_tokens_served(start_controller, make_worker):
    server, _ = ready_controller(start_controller, make_worker)
    ok = {"status": "ok", "finish_reason": "length"}
    before = sample(server, "intentserve_requests_total", **ok)
    tokens = sample(server, "intentserve_generation_tokens_total")
    with client_for(server) as client:
        for i in range(5):
            if i % 2:
                client.completions.create(model=MODEL, prompt="Hi", stream=bool(i % 3))
            else:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}]
                )
    with ControllerClient(server.address, credentials=Credentials()) as grpc_client:
        list(grpc_client.generate("Hi", max_tokens=3))  # gRPC requests are counted alike
    assert sample(server, "intentserve_requests_total", **ok) - before == 6
    assert sample(server, "intentserve_generation_tokens_total") - tokens == 6 * 3
    assert sample(server, "intentserve_time_to_first_token_seconds_count") == 6
    assert sample(server, "intentserve_inter_token_latency_seconds_count") == 6 * 2
    assert sample(server, "intentserve_e2e_request_latency_seconds_count") == 6


def info_labels(server) -> dict[str, dict[str, str]]:
    infos = metrics(server)["intentserve_worker_realized_info"]
    return {labels["worker_id"]: labels for labels, value in infos if value == 1}


def expected_labels(worker: dict) -> dict[str, str]:
    """The info metric's labels, as `intentserve status --json` says them."""
    realized = worker["realized"]
    decision = next(d for d in worker["decisions"] if d["feature"] == "paged_attention")

    def field(name: str) -> str:
        if realized is None:
            return ""
        value = realized[name]
        return str(value).lower() if isinstance(value, bool) else str(value)

    return {
        "deployment": DEPLOYMENT,
        "worker_id": worker["worker_id"],
        "state": worker["state"],
        "device": worker["device_kind"],
        "mode": decision["mode"],
        "required": str(decision["required"]).lower(),
        "enabled": str(field("cache_kind") == "paged").lower(),
        "cache_kind": field("cache_kind"),
        "backend": field("backend"),
        "block_size": field("block_size"),
        "kv_cache_dtype": field("kv_cache_dtype"),
        "scheduler": field("scheduler"),
        "prefix_caching": field("prefix_caching"),
        "weight_format": field("weight_format"),
        "attention_kernel": field("attention_kernel"),
        "kernel_variant": field("kernel_variant"),
        "task": field("task"),
        "reasoning": "" if realized is None else str(bool(realized.get("reasoning"))).lower(),
        "reason_code": worker["reasons"][0]["code"] if worker["reasons"] else "",
    }


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_the_realized_info_metric_matches_status_for_every_worker(
    start_controller, make_worker, mode
):
    server, _ = start_controller(http_port=0, paged_attention=mode, replicas=4, min_ready=1)
    fallback = make_worker(server, "w0", CPU)  # auto: the default scheduler, and why
    paged = make_worker(server, "w1", examples.cuda(flash=False))  # triton paged, and why
    no_kv = make_worker(server, "w2", BERT)  # on: rejected at registration
    failed = make_worker(server, "w3", CPU)  # rejected: its KV cache did not fit
    for worker in (fallback, paged, no_kv, failed):
        worker.register()
        worker.start_heartbeats()
    for worker in (fallback, paged, no_kv):
        if worker.rejection is None:
            worker.report()
    failed.report(load_error=Reason(ReasonCode.KV_BUDGET_TOO_SMALL, "no room for one block"))
    eventually(lambda: len(server.deployment.workers()) == 4, what="4 workers")
    with ControllerClient(server.address, credentials=Credentials()) as admin:
        status = admin.status()
    labels = info_labels(server)
    assert set(labels) == {w["worker_id"] for w in status["workers"]} == {"w0", "w1", "w2", "w3"}
    for worker in status["workers"]:
        assert labels[worker["worker_id"]] == expected_labels(worker), worker["worker_id"]
        assert labels[worker["worker_id"]]["mode"] == mode
    states = {w: labels[w]["state"] for w in labels}
    assert states["w3"] == "rejected" and labels["w3"]["reason_code"] == "kv_budget_too_small"
    if mode == "auto":
        assert labels["w0"]["reason_code"] == "auto_not_enabled_on_device"
        assert labels["w0"]["enabled"] == "false" and states["w0"] == "ready"
    else:
        assert states["w2"] == "rejected" and labels["w2"]["cache_kind"] == ""
    assert labels["w1"]["enabled"] == "true" and labels["w1"]["backend"] == "triton_paged"
    ready = metrics(server)["intentserve_deployment_ready"][0][1]
    assert ready == (1.0 if server.verdict().ready else 0.0)


def test_worker_load_comes_from_heartbeats(start_controller, make_worker):
    server, worker = ready_controller(start_controller, make_worker)
    eventually(lambda: sample(server, "intentserve_worker_kv_blocks_total", worker_id="w0") == 64)
    assert sample(server, "intentserve_worker_kv_blocks_used", worker_id="w0") == 3
    assert sample(server, "intentserve_kv_cache_usage_ratio", worker_id="w0") == 3 / 64
    step = "intentserve_worker_step_duration_seconds"
    assert sample(server, f"{step}_count", worker_id="w0") == 10
    assert sample(server, f"{step}_sum", worker_id="w0") == 0.25
    assert sample(server, "intentserve_worker_batch_size_sum", worker_id="w0") == 30
    assert sample(server, "intentserve_worker_weight_bytes", worker_id="w0") == HONEST_WEIGHT_BYTES
    assert sample(server, "intentserve_deployment_verified_replicas") == 1
    assert sample(server, "intentserve_deployment_min_ready_replicas") == 1
    assert sample(server, "intentserve_reconcile_loop_duration_seconds_count") >= 1


def test_streams_in_flight_end_when_the_controller_stops(start_controller, make_worker):
    server, _ = start_controller(http_port=0, paged_attention="on")
    assert make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK).up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    ended = threading.Event()

    def read() -> None:
        try:
            with httpx.stream(
                "POST",
                f"{server.http_url}/v1/completions",
                json={"model": MODEL, "prompt": "Hi", "stream": True},
                timeout=30,
            ) as response:
                for _ in response.iter_lines():
                    pass
        except httpx.HTTPError:
            pass
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    eventually(lambda: server.deployment.registry.get("w0").num_outstanding == 1, what="stream")
    server.stop(grace_s=0)
    assert ended.wait(10)


def test_a_stream_in_flight_is_given_the_drain_timeout_before_it_is_ended(
    start_controller, make_worker
):
    """What spec.controller.drainTimeoutS gives a stream when the controller stops (SIGTERM:
    Kubernetes' grace period), where it used to get a fixed 2 s."""
    server, _ = start_controller(http_port=0, paged_attention="on")
    assert make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK).up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    ended = threading.Event()

    def read() -> None:
        body = {"model": MODEL, "prompt": "Hi", "stream": True}
        url = f"{server.http_url}/v1/completions"
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("POST", url, json=body, timeout=30) as response,
        ):
            for _ in response.iter_lines():
                pass
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    eventually(lambda: server.deployment.registry.get("w0").num_outstanding == 1, what="stream")
    stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 3.0}, daemon=True)
    started_s = time.monotonic()
    stopper.start()
    assert not ended.wait(2.0)  # still draining
    assert ended.wait(10)
    stopper.join(10)
    assert 3.0 <= time.monotonic() - started_s < 10


def test_an_oversized_prompt_is_refused_alone_and_the_streams_beside_it_go_on(
    start_controller, make_worker
):
    """Found trying it: a 50 MB prompt went to the worker's multiplexed call, over its receive
    limit, which ended the call and every stream on it; its own client read "every READY
    worker's queue is full"."""
    server, _ = start_controller(http_port=0, paged_attention="on")
    worker = make_worker(server, "w0", CPU, num_tokens=20, token_delay_s=0.05)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    with client_for(server) as client:
        stream = client.completions.create(model=MODEL, prompt="Hi", max_tokens=20, stream=True)
        chunks = iter(stream)
        first = next(chunks)
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt="x" * MAX_REQUEST_BYTES, max_tokens=1)
        assert error.value.body["param"] == "prompt"
        assert error.value.body["message"].startswith("prompt: the request is ")
        assert f"allowed: at most {MAX_REQUEST_BYTES} bytes" in error.value.body["message"]
        rest = list(chunks)
    text = "".join(c.choices[0].text for c in [first, *rest] if c.choices)
    assert text == "".join(f"t{i} " for i in range(20))
    assert all(len(r.prompt) < 100 for r in worker.requests)  # the big one never reached it
    assert sample(server, "intentserve_requests_total", status="invalid_argument") == 1


def test_a_body_over_the_limit_is_413_before_it_is_read(start_controller, make_worker):
    server, _ = ready_controller(start_controller, make_worker)
    url = f"{server.http_url}/v1/completions"
    too_big = b'{"model": "smollm2-135m", "prompt": "' + b"x" * MAX_BODY_BYTES + b'"}'
    response = httpx.post(url, content=too_big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    message = response.json()["error"]["message"]
    assert message == f"request body: {len(too_big)} bytes; allowed: at most {MAX_BODY_BYTES}"

    def chunked():  # no content-length: counted as it comes
        yield too_big[: len(too_big) // 2]
        yield too_big[len(too_big) // 2 :]

    response = httpx.post(url, content=chunked(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["message"].startswith("request body: over ")
    # the server is fine for everyone else
    with client_for(server) as client:
        assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=3).choices


def test_models_say_the_max_model_len_and_what_each_worker_realized(start_controller, make_worker):
    server, worker = ready_controller(start_controller, make_worker)
    headers = {}
    model = httpx.get(f"{server.http_url}/v1/models", headers=headers, timeout=5).json()["data"][0]
    realized = worker.matching_realized()
    assert model["id"] == MODEL and model["max_model_len"] == realized.max_model_len
    [mine] = model["realized"]
    assert mine["worker_id"] == "w0" and mine["cache_kind"] == realized.kind.value
    assert mine["backend"] == realized.backend.value and mine["state"] == "ready"
    assert "address" not in mine


def test_version_says_the_package_version(start_controller, make_worker):
    from intentserve import __version__

    server, _ = ready_controller(start_controller, make_worker)
    assert httpx.get(f"{server.http_url}/version", timeout=5).json() == {"version": __version__}


def test_cors_is_off_by_default_and_allows_only_the_configured_origins(
    start_controller, make_worker
):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    server, _ = ready_controller(start_controller, make_worker)
    off = httpx.options(f"{server.http_url}/v1/completions", headers=preflight, timeout=5)
    assert "access-control-allow-origin" not in off.headers
    server, _ = ready_controller(
        start_controller, make_worker, cors_origins=["https://app.example"]
    )
    allowed = httpx.options(f"{server.http_url}/v1/completions", headers=preflight, timeout=5)
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = {**preflight, "Origin": "https://evil.example"}
    refused = httpx.options(f"{server.http_url}/v1/completions", headers=other, timeout=5)
    assert "access-control-allow-origin" not in refused.headers


def test_a_client_gone_before_its_body_ends_is_a_refusal_not_a_server_error(
    start_controller, make_worker, caplog
):
    """A body cut short (its client closed, or the body deadline closed it) is the client's
    doing: counted as a refusal, with no error line and traceback (which a client could send at
    will to flood the log)."""
    server, _ = ready_controller(start_controller, make_worker)
    host, port = server.http_url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": "smollm2')
    refused = "intentserve_http_requests_refused_total"
    eventually(lambda: sample(server, refused, route="/v1/completions", status="400") == 1)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
