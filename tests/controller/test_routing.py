"""Inference through a real controller to scripted workers: only READY workers, least outstanding
first, cancellation and deadlines reach the worker, overload and lost workers end cleanly."""

import threading

import grpc
import pytest
from intentserve.common.field_errors import violation_of
from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.controller.control.convert import worker_state_from_pb
from intentserve.controller.control.state import WorkerState
from intentserve.controller.errors import RequestTooLarge
from intentserve.controller.router.request_size import check_size
from intentserve.policy import examples
from intentserve.v1 import admin_pb2, inference_pb2, worker_pb2

from tests.controller.conftest import eventually
from tests.controller.scripted_worker import INVALID_DETAILS, INVALID_FIELD, Behaviour

pytestmark = pytest.mark.integration

CPU = examples.cpu()


def ready_workers(start_controller, make_worker, num_workers, **worker_kwargs):
    server, client = start_controller(paged_attention="on", replicas=num_workers, min_ready=1)
    workers = [make_worker(server, f"w{i}", CPU, **worker_kwargs) for i in range(num_workers)]
    for worker in workers:
        assert worker.up().verified
    eventually(lambda: server.verdict().num_verified == num_workers, what="verified workers")
    return server, client, workers


def outstanding(server, worker_id):
    return server.deployment.registry.get(worker_id).num_outstanding


def test_not_ready_is_unavailable_with_the_readiness_reason(start_controller):
    _, client = start_controller(paged_attention="on")
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error.value.details() == (
        "deployment is not ready: not_enough_replicas: 0 of 1 required replicas verified"
    )


def test_a_workers_invalid_argument_passes_through_naming_the_field(start_controller, make_worker):
    # The request's content is checked once, by the worker's engine; the controller relays it.
    server, client, (worker,) = ready_workers(
        start_controller, make_worker, 1, behaviour=Behaviour.INVALID
    )
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == INVALID_DETAILS
    assert violation_of(error.value) == INVALID_FIELD  # the worker's BadRequest detail
    assert worker.num_requests == 1
    assert outstanding(server, "w0") == 0


def test_tokens_stream_back_from_a_ready_worker(start_controller, make_worker):
    _, client, (worker,) = ready_workers(start_controller, make_worker, 1, num_tokens=4)
    responses = list(client.generate(timeout=5))
    assert "".join(r.text for r in responses) == "t0 t1 t2 t3 "  # chunks that wait may merge
    assert responses[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert {r.worker_id for r in responses} == {"w0"}
    assert worker.num_requests == 1


def test_concurrent_requests_to_a_worker_share_its_one_multiplexed_call(
    start_controller, make_worker
):
    _, client, (worker,) = ready_workers(start_controller, make_worker, 1, num_tokens=5)
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = "".join(r.text for r in client.generate(timeout=10))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: "t0 t1 t2 t3 t4 " for i in range(8)}
    assert worker.num_requests == 8
    assert worker.num_serve_calls == 1


def test_routing_never_reaches_a_rejected_or_loading_worker(start_controller, make_worker):
    server, client = start_controller(paged_attention="on", replicas=3, min_ready=1)
    good = make_worker(server, "good", CPU)
    good.up()
    rejected = make_worker(server, "rejected", examples.mixed())
    assert rejected.register().WhichOneof("outcome") == "rejection"
    loading = make_worker(server, "loading", CPU)
    loading.register()
    eventually(lambda: server.verdict().failed, what="FAILED")
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as error:
            list(client.generate(timeout=5))
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "worker rejected: the device map places layers on" in error.value.details()
    # The rejected worker comes back able to serve: verified from scratch, the gate opens.
    rejected.capability = CPU
    rejected.up()
    eventually(lambda: server.verdict().ready, what="READY")
    for _ in range(6):
        assert list(client.generate(timeout=5))
    assert loading.num_requests == 0
    assert good.num_requests + rejected.num_requests == 6
    assert good.num_requests and rejected.num_requests


def test_routing_never_reaches_a_draining_worker_and_its_streams_finish(
    start_controller, make_worker
):
    server, client, (w0, w1) = ready_workers(
        start_controller, make_worker, 2, num_tokens=5, token_delay_s=0.05
    )
    streams = [client.generate(timeout=10) for _ in range(2)]
    firsts = [next(s) for s in streams]
    assert {r.worker_id for r in firsts} == {"w0", "w1"}  # least outstanding spreads them
    drained = client.admin.Drain(admin_pb2.DrainRequest(worker_id="w1"), timeout=5)
    assert worker_state_from_pb(drained.state) is WorkerState.DRAINING
    assert drained.num_outstanding == 1
    for first, stream in zip(firsts, streams, strict=True):
        assert len([first, *stream]) == 5  # the drained worker's stream finishes too
    for _ in range(4):
        assert {r.worker_id for r in client.generate(timeout=5)} == {"w0"}
    assert (w0.num_requests, w1.num_requests) == (5, 1)
    drain = worker_pb2.HEARTBEAT_ACTION_DRAIN
    eventually(lambda: w1.actions[-1] == drain, what="the DRAIN heartbeat action")


def test_least_outstanding_first_then_resource_exhausted(start_controller, make_worker):
    server, client = start_controller(
        paged_attention="on", replicas=2, min_ready=1, max_outstanding_per_worker=1, max_queued=0
    )
    w0, w1 = (make_worker(server, f"w{i}", CPU, behaviour=Behaviour.BLOCK) for i in range(2))
    w0.up()
    w1.up()
    eventually(lambda: server.verdict().num_verified == 2)
    streams = [client.generate(timeout=10) for _ in range(2)]
    assert {next(s).worker_id for s in streams} == {"w0", "w1"}
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_queued (spec.controller.admission.maxQueued): 0" in error.value.details()
    for stream in streams:
        stream.cancel()
    eventually(lambda: outstanding(server, "w0") == outstanding(server, "w1") == 0)


def test_one_worker_at_its_limit_with_no_queue_is_resource_exhausted(start_controller, make_worker):
    server, client = start_controller(
        paged_attention="on", replicas=2, min_ready=1, max_outstanding_per_worker=1, max_queued=0
    )
    make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK).up()
    eventually(lambda: server.verdict().ready)
    stream = client.generate(timeout=10)
    next(stream)
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.value.details() == (
        "every worker slot is taken and the admission queue is full: 0 requests wait "
        "(max_queued (spec.controller.admission.maxQueued): 0)"
    )
    stream.cancel()


def choices(n: int) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        prompt="hello", n=n, stop=inference_pb2.StopConditions(max_tokens=4)
    )


def test_n_choices_go_to_one_worker_and_take_n_of_its_slots(start_controller, make_worker):
    server, client = start_controller(
        paged_attention="on", replicas=2, min_ready=1, max_outstanding_per_worker=4, max_queued=0
    )
    w0, w1 = (make_worker(server, f"w{i}", CPU, behaviour=Behaviour.BLOCK) for i in range(2))
    w0.up()
    w1.up()
    eventually(lambda: server.verdict().num_verified == 2)
    three = client.inference.Generate(choices(3), timeout=10)
    first = next(three)
    eventually(lambda: outstanding(server, first.worker_id) == 3, what="3 slots")
    two = client.inference.Generate(choices(2), timeout=10)  # 3 + 2 > 4: the other worker
    other = next(two).worker_id
    assert other != first.worker_id and outstanding(server, other) == 2
    with pytest.raises(grpc.RpcError) as error:  # neither has 3 free
        list(client.inference.Generate(choices(3), timeout=5))
    assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert w0.num_requests + w1.num_requests == 2  # each n-choice request is one request
    for stream in (three, two):
        stream.cancel()
    eventually(lambda: outstanding(server, "w0") == outstanding(server, "w1") == 0)


def test_n_past_a_workers_limit_takes_all_its_slots_and_the_worker_decides(
    start_controller, make_worker
):
    server, client = start_controller(
        paged_attention="on", replicas=1, max_outstanding_per_worker=2, max_queued=0
    )
    worker = make_worker(server, "w0", CPU)
    worker.up()
    eventually(lambda: server.verdict().ready)
    responses = list(client.inference.Generate(choices(3), timeout=10))
    assert sorted({r.index for r in responses}) == [0, 1, 2]
    assert [r.index for r in responses if r.finish_reason] == [0, 1, 2]
    assert outstanding(server, "w0") == 0


def test_a_retry_before_the_first_token_sends_every_choice(start_controller, make_worker):
    server, client, (w0, w1) = ready_workers(start_controller, make_worker, 2)
    w0.behaviour = Behaviour.BUSY
    for _ in range(2):
        responses = list(client.inference.Generate(choices(2), timeout=5))
        assert {(r.worker_id, r.index) for r in responses} == {("w1", 0), ("w1", 1)}
    assert w0.num_requests >= 1  # tried first at least once (workers take turns)
    assert all(r.n == 2 for r in w0.requests + w1.requests)


def test_a_full_worker_queue_sends_the_request_elsewhere(start_controller, make_worker):
    server, client, (w0, w1) = ready_workers(start_controller, make_worker, 2)
    w0.behaviour = Behaviour.BUSY
    for _ in range(4):
        assert {r.worker_id for r in client.generate(timeout=5)} == {"w1"}


def test_a_request_every_worker_refuses_as_full_waits_in_the_queue(start_controller, make_worker):
    """A worker's refusal counts every router's requests: the request is kept queued and sent
    again when a worker has room, until its deadline."""
    server, client, (w0, w1) = ready_workers(start_controller, make_worker, 2)
    w0.behaviour = w1.behaviour = Behaviour.BUSY
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=1))
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "in the admission queue, waiting for a worker slot" in error.value.details()
    num_refused = w0.num_requests + w1.num_requests
    assert num_refused > 2  # each worker was tried again, not once
    waiting = client.generate(timeout=10)
    threading.Timer(0.3, lambda: setattr(w1, "behaviour", Behaviour.STREAM)).start()
    assert {r.worker_id for r in waiting} == {"w1"}


def test_a_client_cancel_reaches_the_worker(start_controller, make_worker):
    server, client, (worker,) = ready_workers(
        start_controller, make_worker, 1, behaviour=Behaviour.BLOCK
    )
    stream = client.generate(timeout=30)
    next(stream)
    assert not worker.cancelled.is_set()
    stream.cancel()
    assert worker.cancelled.wait(5), "the worker never saw the cancel"
    eventually(lambda: outstanding(server, "w0") == 0, what="the request released")


def test_64_concurrent_streams_all_finish_with_their_tokens_in_order(start_controller, make_worker):
    # Every stream is written from the controller's one event loop; none waits on another.
    server, client = start_controller(paged_attention="on", max_outstanding_per_worker=64)
    worker = make_worker(server, "w0", CPU, num_tokens=12, token_delay_s=0.005)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    results: dict[int, str] = {}
    start = threading.Barrier(64)

    def run(i: int) -> None:
        start.wait()
        results[i] = "".join(r.text for r in client.generate(max_tokens=12, timeout=30))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    expected = "".join(f"t{k} " for k in range(12))
    assert results == {i: expected for i in range(64)}
    assert worker.num_requests == 64
    assert worker.num_serve_calls == 1
    eventually(lambda: outstanding(server, "w0") == 0, what="every request released")


def test_a_cancel_mid_stream_reaches_the_worker_for_that_request_only(
    start_controller, make_worker
):
    server, client, (worker,) = ready_workers(
        start_controller, make_worker, 1, behaviour=Behaviour.BLOCK
    )
    streams = [client.generate(timeout=30) for _ in range(4)]
    firsts = [next(stream) for stream in streams]
    streams[1].cancel()
    eventually(lambda: worker.cancelled_ids, what="the worker saw a cancel")
    assert worker.cancelled_ids == [firsts[1].request_id]
    eventually(lambda: outstanding(server, "w0") == 3, what="the cancelled request released")
    cancelled = {"status": "cancelled"}
    assert server.metrics.get_sample_value(
        "intentserve_requests_total", _labels(server, cancelled)
    ) == pytest.approx(1.0)
    assert all(streams[i].is_active() for i in (0, 2, 3))
    for i in (0, 2, 3):
        streams[i].cancel()
    eventually(lambda: len(worker.cancelled_ids) == 4, what="every cancel reached the worker")
    eventually(lambda: outstanding(server, "w0") == 0, what="every request released")


def _labels(server, labels: dict[str, str]) -> dict[str, str]:
    desired = server.config.desired
    base = {"deployment": desired.deployment, "model_name": desired.model, "finish_reason": ""}
    return {**base, **labels}


def test_the_client_deadline_reaches_the_worker(start_controller, make_worker):
    server, client, (worker,) = ready_workers(
        start_controller, make_worker, 1, behaviour=Behaviour.BLOCK
    )
    stream = client.generate(timeout=0.5)
    next(stream)
    with pytest.raises(grpc.RpcError) as error:
        list(stream)
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # The forwarded call carries the client's deadline (clock skew between the two reads aside).
    assert 0 < worker.deadlines_s[0] <= 0.5 + 0.05
    assert worker.cancelled.wait(5)
    # Counted with the code its client got, not as a client's cancel.
    deadline = _labels(server, {"status": "deadline_exceeded"})
    eventually(
        lambda: server.metrics.get_sample_value("intentserve_requests_total", deadline) == 1,
        what="the request counted as deadline_exceeded",
    )
    cancelled = _labels(server, {"status": "cancelled"})
    assert server.metrics.get_sample_value("intentserve_requests_total", cancelled) is None


def test_a_worker_dying_ends_only_its_stream_and_new_requests_go_elsewhere(
    start_controller, make_worker
):
    server, client, (w0, w1) = ready_workers(
        start_controller, make_worker, 2, num_tokens=20, token_delay_s=0.02
    )
    streams = {}
    for _ in range(2):
        stream = client.generate(timeout=10)
        streams[next(stream).worker_id] = stream
    w0.kill_server()
    with pytest.raises(grpc.RpcError) as error:
        list(streams["w0"])
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error.value.details().startswith("worker w0 became unavailable mid-stream")
    assert len(list(streams["w1"])) == 19
    # Suspect at once (it still heartbeats, but its server is gone): new requests go to w1.
    for _ in range(4):
        assert {r.worker_id for r in client.generate(timeout=5)} == {"w1"}
    w1.kill_server()
    eventually(lambda: not server.verdict().ready, what="both suspect: not ready")
    with pytest.raises(grpc.RpcError) as error:
        list(client.generate(timeout=5))
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    details = error.value.details()
    assert details.startswith("deployment is not ready: not_enough_replicas: 0 of 1 required")
    # w0's stream and connection broke together: either news may have come first.
    assert "w0 (suspect: " in details
    assert "w1 (suspect: its connection broke (" in details


def test_a_worker_lost_to_heartbeats_mid_stream_ends_with_unavailable(
    start_controller, make_worker
):
    server, client, (w0, w1) = ready_workers(
        start_controller, make_worker, 2, behaviour=Behaviour.BLOCK
    )
    streams = {}
    for _ in range(2):
        stream = client.generate(timeout=10)
        streams[next(stream).worker_id] = stream
    w0.stop_heartbeats()
    errors = []

    def drain_w0():
        try:
            list(streams["w0"])
        except grpc.RpcError as error:
            errors.append(error)

    reader = threading.Thread(target=drain_w0)
    reader.start()
    reader.join(timeout=5)
    (error,) = errors
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert error.details().startswith("worker w0 was lost mid-stream: lost: no heartbeat for")
    assert w0.cancelled.wait(5)  # the controller cancelled its call to the lost worker
    assert not w1.cancelled.is_set() and streams["w1"].is_active()
    assert server.verdict().ready  # min_ready 1: w1 still serves
    assert {r.worker_id for r in [next(client.generate(timeout=5))]} == {"w1"}
    streams["w1"].cancel()


def test_stop_lets_running_streams_finish_within_the_grace(start_controller, make_worker):
    server, client, _ = ready_workers(
        start_controller, make_worker, 1, num_tokens=10, token_delay_s=0.05
    )
    stream = client.generate(max_tokens=10, timeout=30)
    first = next(stream)
    stopping = threading.Thread(target=server.stop, kwargs={"grace_s": 10.0})
    stopping.start()
    rest = list(stream)
    stopping.join(10)
    assert first.text + "".join(r.text for r in rest) == "".join(f"t{k} " for k in range(10))
    assert not stopping.is_alive()


def test_stop_ends_streams_still_running_after_the_grace(start_controller, make_worker):
    server, client, (worker,) = ready_workers(
        start_controller, make_worker, 1, behaviour=Behaviour.BLOCK
    )
    stream = client.generate(timeout=30)
    next(stream)
    server.stop(grace_s=0.2)
    with pytest.raises(grpc.RpcError) as error:
        list(stream)
    assert error.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    # Its handler cancelled the worker's request on the way out (or the channel's close did).
    assert worker.cancelled.wait(5)


@pytest.mark.parametrize(
    ("request_fields", "named"),
    [
        ({"prompt": "x" * (MAX_REQUEST_BYTES + 1)}, "prompt"),
        ({"prompt_token_ids": [70000] * (MAX_REQUEST_BYTES // 3)}, "prompt_token_ids"),
        (
            {"messages": [inference_pb2.ChatMessage(role="user", content="y" * MAX_REQUEST_BYTES)]},
            "messages",
        ),
        (
            {"prompt": "hi", "stop": inference_pb2.StopConditions(stop=["z" * 1024] * 4200)},
            "stop.stop",
        ),
    ],
)
def test_a_request_over_the_size_limit_is_refused_naming_its_largest_field(request_fields, named):
    request = inference_pb2.GenerateRequest(request_id="r-1", **request_fields)
    with pytest.raises(RequestTooLarge) as error:
        check_size(request)
    size = request.ByteSize()
    assert str(error.value) == (
        f"{named}: the request is {size} bytes; allowed: at most {MAX_REQUEST_BYTES} bytes in all "
        "(prompt, messages, stop strings and the rest)"
    )


def test_a_request_at_the_size_limit_is_let_through():
    request = inference_pb2.GenerateRequest(request_id="r-1", prompt="x" * MAX_REQUEST_BYTES)
    while request.ByteSize() != MAX_REQUEST_BYTES:  # the length's own varint moves with it
        request.prompt = "x" * (len(request.prompt) - (request.ByteSize() - MAX_REQUEST_BYTES))
    check_size(request)  # no error
