"""Load beyond what the workers realized waits in the controller's admission queue, in arrival
order, for both front ends: a real controller with scripted workers on loopback. Only a full
queue is refused, naming its limit; the queue's length and waits are on /metrics."""

from __future__ import annotations

import threading

import grpc
import httpx2 as httpx
import openai
import pytest
from intentserve.policy import examples

from tests.controller.conftest import eventually
from tests.controller.scripted_worker import Behaviour
from tests.controller.test_http_api import HI, MODEL, client_for, sample

pytestmark = pytest.mark.integration

CPU = examples.cpu()
SLOTS = 8  # the sequence slots a scripted paged worker realizes (scripted_worker.realized_for)
FULL = "max_queued (spec.controller.admission.maxQueued): 2"


def queued(server) -> int:
    return server.router.queue.num_waiting


def in_flight(server) -> list[int]:
    return [r.num_outstanding for r in server.deployment.workers()]


def test_four_times_the_slots_are_all_served_each_in_arrival_order(start_controller, make_worker):
    server, client = start_controller(paged_attention="on", replicas=2)
    workers = [
        make_worker(server, f"w{i}", CPU, num_tokens=4, token_delay_s=0.25) for i in range(2)
    ]
    for worker in workers:
        assert worker.up().verified
    eventually(lambda: server.verdict().num_verified == 2, what="both verified")
    num_streams = 4 * 2 * SLOTS
    results: dict[int, str] = {}
    refused: list[grpc.RpcError] = []
    peak = {"queued": 0, "per_worker": 0}

    def run(i: int) -> None:
        try:
            responses = client.generate(prompt=str(i), max_tokens=4, timeout=60)
            results[i] = "".join(r.text for r in responses)
        except grpc.RpcError as error:
            refused.append(error)

    def arrived(i: int) -> bool:
        peak["queued"] = max(peak["queued"], queued(server))
        peak["per_worker"] = max(peak["per_worker"], *in_flight(server))
        return queued(server) + sum(in_flight(server)) + len(results) + len(refused) > i

    threads = [threading.Thread(target=run, args=(i,)) for i in range(num_streams)]
    for i, thread in enumerate(threads):  # one at a time: the arrival order is known
        thread.start()
        eventually(lambda i=i: arrived(i), what=f"request {i} in the controller")
    for thread in threads:
        thread.join(60)
    assert refused == []
    assert results == {i: "t0 t1 t2 t3 " for i in range(num_streams)}
    assert peak["queued"] >= SLOTS, "the load never waited in the queue"
    assert peak["per_worker"] <= SLOTS, "a worker was sent more than its sequence slots"
    for worker in workers:  # each worker was started on its requests in the order they came
        order = [int(prompt) for prompt in worker.arrivals]
        assert order == sorted(order)
    assert sum(len(w.arrivals) for w in workers) == num_streams
    assert queued(server) == 0


def test_a_full_queue_is_refused_by_both_front_ends_naming_its_limit(start_controller, make_worker):
    server, client = start_controller(
        http_port=0, paged_attention="on", max_outstanding_per_worker=1, max_queued=2
    )
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    running = client.generate(prompt="running", timeout=30)
    next(running)
    waiting_grpc = client.generate(prompt="grpc", timeout=30)
    eventually(lambda: queued(server) == 1, what="the gRPC request queued")
    http_answer: dict[str, httpx.Response] = {}
    body = {"model": MODEL, "prompt": "http", "max_tokens": 2}
    waiting_http = threading.Thread(
        target=lambda: http_answer.update(
            response=httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=30)
        )
    )
    waiting_http.start()
    eventually(lambda: queued(server) == 2, what="the HTTP request queued behind it")
    assert sample(server, "intentserve_num_requests_queued") == 2

    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert FULL in error.value.details()
    with client_for(server) as http, pytest.raises(openai.RateLimitError) as limited:
        http.chat.completions.create(model=MODEL, messages=HI)
    assert FULL in limited.value.message
    assert queued(server) == 2  # the refused ones never took a place

    running.cancel()  # its slot goes to the first in line, the gRPC request
    eventually(lambda: worker.arrivals[-1:] == ["grpc"], what="the gRPC request started")
    assert queued(server) == 1 and not http_answer
    waiting_grpc.cancel()  # then to the HTTP one
    eventually(lambda: worker.arrivals[-1:] == ["http"], what="the HTTP request started")
    assert queued(server) == 0
    assert sample(server, "intentserve_request_queue_time_seconds_count") >= 2


def test_a_request_whose_client_goes_away_leaves_the_queue_at_once(start_controller, make_worker):
    server, client = start_controller(
        http_port=0, paged_attention="on", max_outstanding_per_worker=1
    )
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    running = client.generate(prompt="running", timeout=30)
    next(running)
    waiting = client.generate(prompt="waiting", timeout=30)
    eventually(lambda: queued(server) == 1, what="queued")
    waiting.cancel()
    eventually(lambda: queued(server) == 0, timeout_s=1.0, what="the cancelled request gone")
    body = {"model": MODEL, "prompt": "http", "max_tokens": 2}
    with pytest.raises(httpx.ReadTimeout):  # then the client hangs up
        httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=0.5)
    eventually(lambda: queued(server) == 0, timeout_s=1.0, what="the disconnected request gone")
    assert sample(server, "intentserve_requests_total", status="cancelled") == 2
    running.cancel()
    assert worker.arrivals == ["running"]


def test_a_deadline_or_the_longest_wait_passing_in_the_queue_ends_the_request(
    start_controller, make_worker
):
    server, client = start_controller(
        http_port=0, paged_attention="on", max_outstanding_per_worker=1, max_queue_wait_s=0.3
    )
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    running = client.generate(prompt="running", timeout=30)
    next(running)
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=0.2))
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # The controller's status, not the client's own timer: it says where the time went.
    assert error.value.details().startswith("deadline exceeded after 0.")
    assert "in the admission queue, waiting for a worker slot" in error.value.details()
    body = {"model": MODEL, "prompt": "late", "max_tokens": 2}
    answer = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=10)
    assert answer.status_code == 504
    message = answer.json()["error"]["message"]
    assert "in the admission queue for a worker slot" in message
    assert "max_queue_wait_s (spec.controller.admission.maxQueueWaitS): 0.3 s" in message
    eventually(lambda: queued(server) == 0, what="both gone from the queue")
    running.cancel()
    assert worker.arrivals == ["running"]


def test_waiting_requests_end_unavailable_when_the_deployment_stops_being_ready(
    start_controller, make_worker
):
    server, client = start_controller(paged_attention="on", max_outstanding_per_worker=1)
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    running = client.generate(prompt="running", timeout=30)
    next(running)
    waiting = client.generate(prompt="waiting", timeout=30)
    eventually(lambda: queued(server) == 1, what="queued")
    worker.stop_heartbeats()  # LOST after the heartbeat timeout (1 s): nothing left to wait for
    with pytest.raises(grpc.RpcError) as error:
        list(waiting)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error.value.details().startswith("deployment is not ready: ")
    assert queued(server) == 0
    assert worker.arrivals == ["running"]
