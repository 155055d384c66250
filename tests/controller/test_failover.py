"""Failover through a real controller on loopback: a worker whose stream or connection breaks is
SUSPECT at once (well inside the heartbeat timeout, which these tests set to 5 s); a client's own
cancel or deadline never is; a worker SIGKILLed under 32 streams ends each of its streams with
UNAVAILABLE naming it while every other stream finishes whole."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from intentserve.controller.control.state import WorkerState
from intentserve.policy import examples

from tests.controller.conftest import eventually
from tests.controller.scripted_worker import BREAK_DETAILS, Behaviour
from tests.controller.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

CPU = examples.cpu()
SLOW_HEARTBEAT = {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 5.0}
FAILOVER_BOUND_S = 1.0
NUM_STREAMS = 32
NUM_TOKENS = 100


def state_of(server, worker_id: str) -> WorkerState:
    return server.deployment.registry.get(worker_id).state


def seconds_until_not_serving(client, started_s: float, limit_s: float = 10.0) -> float:
    """Poll health as a client sees it; seconds from `started_s` until NOT_SERVING."""
    while client.serving():
        if time.monotonic() - started_s > limit_s:
            pytest.fail(f"still SERVING {limit_s} s after the worker died")
        time.sleep(0.005)
    return time.monotonic() - started_s


@pytest.fixture
def processes():
    started: list[WorkerProcess] = []

    def start(address: str, worker_id: str, **kwargs) -> WorkerProcess:
        started.append(WorkerProcess(address, worker_id, **kwargs))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def test_a_killed_worker_without_streams_is_not_serving_within_a_second(
    start_controller, processes
):
    server, client = start_controller(
        paged_attention="on", replicas=2, min_ready=2, **SLOW_HEARTBEAT
    )
    processes(server.address, "w0")
    w1 = processes(server.address, "w1")
    eventually(client.serving, what="SERVING")
    time.sleep(0.3)  # the controller's connections to both workers are up
    killed_s = time.monotonic()
    w1.kill()
    assert seconds_until_not_serving(client, killed_s) < FAILOVER_BOUND_S
    record = server.deployment.registry.get("w1")
    assert record.state is WorkerState.SUSPECT
    assert record.problem.message.startswith("suspect: its connection broke (")


def test_a_broken_stream_makes_its_worker_suspect_and_a_heartbeat_restores_it(
    start_controller, make_worker
):
    server, client = start_controller(
        paged_attention="on", replicas=2, min_ready=1, **SLOW_HEARTBEAT
    )
    w0 = make_worker(server, "w0", CPU, behaviour=Behaviour.BREAK)
    w1 = make_worker(server, "w1", CPU, num_tokens=2)
    assert w0.up().verified and w1.up().verified
    eventually(lambda: server.verdict().num_verified == 2, what="two verified workers")
    w1.stop_heartbeats()  # w1 keeps serving; only w0 may come back within these checks
    streams = [client.generate(timeout=5) for _ in range(2)]
    firsts = [next(s) for s in streams]
    broken = streams[[f.worker_id for f in firsts].index("w0")]
    with pytest.raises(grpc.RpcError) as error:
        list(broken)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error.value.details() == f"worker w0 became unavailable mid-stream: {BREAK_DETAILS}"
    assert state_of(server, "w0") is WorkerState.SUSPECT  # at once: no heartbeat timeout
    for _ in range(4):
        assert {r.worker_id for r in client.generate(timeout=5)} == {"w1"}
    assert w0.num_requests == 1
    w0.behaviour = Behaviour.STREAM
    w1.start_heartbeats()
    eventually(lambda: state_of(server, "w0") is WorkerState.READY, what="w0 restored")
    assert "w0" in {next(client.generate(timeout=5)).worker_id for _ in range(4)}


def test_a_client_cancel_or_deadline_leaves_the_worker_ready(start_controller, make_worker):
    server, client = start_controller(paged_attention="on", **SLOW_HEARTBEAT)
    worker = make_worker(server, "w0", CPU, behaviour=Behaviour.BLOCK)
    worker.up()
    eventually(lambda: server.verdict().ready, what="READY")
    stream = client.generate(timeout=30)
    next(stream)
    stream.cancel()
    assert worker.cancelled.wait(5)
    stream = client.generate(timeout=0.3)
    next(stream)
    with pytest.raises(grpc.RpcError) as error:
        list(stream)
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.2)
    assert state_of(server, "w0") is WorkerState.READY
    assert server.verdict().ready


def test_a_worker_sigkilled_under_32_streams_loses_none_silently(start_controller, processes):
    # Every stream runs at once (a scripted worker realizes 8 slots): none waits in the queue.
    server, client = start_controller(
        paged_attention="on",
        replicas=2,
        min_ready=2,
        max_outstanding_per_worker=NUM_STREAMS,
        **SLOW_HEARTBEAT,
    )
    workers = {
        worker_id: processes(server.address, worker_id, num_tokens=NUM_TOKENS, token_delay_s=0.02)
        for worker_id in ("w0", "w1")
    }
    eventually(client.serving, what="SERVING")
    started = threading.Barrier(NUM_STREAMS + 1)

    def one_stream() -> tuple[str, str, int]:
        """(worker, outcome, tokens): OK with every token, or the error's code and details."""
        stream = client.generate(max_tokens=NUM_TOKENS, timeout=30)
        first = next(stream)
        started.wait(10)
        chunks = [first]
        try:
            chunks += list(stream)
        except grpc.RpcError as error:
            tokens = sum(len(c.token_ids) for c in chunks)  # chunks that wait may merge
            return first.worker_id, f"{error.code().name}: {error.details()}", tokens
        return first.worker_id, "OK", sum(len(c.token_ids) for c in chunks)

    with futures.ThreadPoolExecutor(NUM_STREAMS) as pool:
        pending = [pool.submit(one_stream) for _ in range(NUM_STREAMS)]
        started.wait(10)
        killed_s = time.monotonic()
        workers["w1"].kill()
        failover_s = seconds_until_not_serving(client, killed_s)
        done, hung = futures.wait(pending, timeout=20)
    assert not hung, f"{len(hung)} streams hung"
    outcomes = [f.result() for f in done]
    by_worker = {w: [o for o in outcomes if o[0] == w] for w in ("w0", "w1")}
    assert len(outcomes) == NUM_STREAMS and by_worker["w0"] and by_worker["w1"]
    assert all(o[1:] == ("OK", NUM_TOKENS) for o in by_worker["w0"]), by_worker["w0"]
    for _, outcome, num_tokens in by_worker["w1"]:
        assert outcome.startswith("UNAVAILABLE: worker w1 "), outcome
        assert num_tokens < NUM_TOKENS
    assert failover_s < FAILOVER_BOUND_S
    assert state_of(server, "w1") is WorkerState.SUSPECT
