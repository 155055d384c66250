"""`ControllerClient.generate`, the blocking client: every stream of one client, from any
number of threads, shares one `Inference.GenerateMany` call; each stream still reads as its own
call would (chunks, its error's code and details, leaving early, its deadline), and a controller
that stops answering cannot hold a caller past its deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from intentserve.client import (
    AsyncControllerClient,
    ClientError,
    ControllerClient,
    RequestValueError,
)
from intentserve.client.requests import generate_request
from intentserve.common.streaming import GENERATE_MANY_ACCEPTED, MAX_REQUEST_BYTES
from intentserve.v1 import inference_pb2, inference_pb2_grpc

from tests.controller.conftest import DEPLOYMENT, PLAINTEXT, eventually, ready
from tests.controller.scripted_worker import Behaviour

pytestmark = pytest.mark.integration


class CountingInference(inference_pb2_grpc.InferenceServicer):
    """A stand-in controller's Inference: counts its calls of each kind; GenerateMany answers
    each start with `num_tokens` one-token events (or nothing at all when `silent`)."""

    def __init__(self, num_tokens: int = 3, silent: bool = False) -> None:
        self.num_tokens = num_tokens
        self.silent = silent
        self.calls = {"Generate": 0, "GenerateMany": 0}

    async def Generate(self, request, context):
        self.calls["Generate"] += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this stand-in serves GenerateMany")

    async def GenerateMany(self, request_iterator, context):
        self.calls["GenerateMany"] += 1
        await context.send_initial_metadata((GENERATE_MANY_ACCEPTED,))
        async for command in request_iterator:
            if self.silent or not command.HasField("start"):
                continue
            for k in range(self.num_tokens):
                output = inference_pb2.GenerateResponse(
                    text=f"{command.start.prompt}{k}",
                    token_ids=[k],
                    finish_reason=(
                        inference_pb2.FINISH_REASON_LENGTH if k == self.num_tokens - 1 else 0
                    ),
                )
                event = inference_pb2.GenerateEvent(stream=command.stream, output=output)
                yield inference_pb2.GenerateEvents(events=[event])


@pytest.fixture
def stand_in():
    """Serve a CountingInference on loopback from its own event loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(servicer: CountingInference) -> str:
        async def serve() -> int:
            server = grpc.aio.server()
            inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            return port

        port = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_the_threads_of_one_client_share_one_call(stand_in):
    servicer = CountingInference(num_tokens=3)
    address = stand_in(servicer)
    with ControllerClient(address, credentials=PLAINTEXT) as client:

        def run(i: int) -> list[str]:
            return [c["text"] for c in client.generate(f"p{i}-", max_tokens=3, timeout_s=30)]

        with ThreadPoolExecutor(32) as pool:
            texts = list(pool.map(run, range(32)))
    assert texts == [[f"p{i}-0", f"p{i}-1", f"p{i}-2"] for i in range(32)]
    assert servicer.calls == {"Generate": 0, "GenerateMany": 1}


def test_a_controller_that_stops_answering_cannot_hold_the_caller_past_its_deadline(stand_in):
    address = stand_in(CountingInference(silent=True))
    with ControllerClient(address, credentials=PLAINTEXT) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as error:
            list(client.generate("hello", timeout_s=0.5))
        waited = time.monotonic() - start
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "timeout_s" in error.value.details()
    assert 0.5 <= waited < 4


def test_streams_from_many_threads_match_their_own_calls(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, num_tokens=12, token_delay_s=0.005)
    with ControllerClient(server.address, credentials=PLAINTEXT) as client:

        def run(_: int) -> str:
            return "".join(c["text"] for c in client.generate("hello", max_tokens=12, timeout_s=30))

        with ThreadPoolExecutor(64) as pool:
            texts = list(pool.map(run, range(64)))
    assert texts == ["".join(f"t{k} " for k in range(12))] * 64  # chunks may merge
    assert worker.num_requests == 64


def test_n_choices_stream_with_their_index_until_the_last_ends(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, num_tokens=3, token_delay_s=0.005)
    with ControllerClient(server.address, credentials=PLAINTEXT) as client:
        chunks = list(client.generate("hello", n=3, timeout_s=30))

        async def agenerate() -> list[dict]:
            async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as aclient:
                return [c async for c in aclient.generate("hello", n=2, timeout_s=30)]

        achunks = asyncio.run(agenerate())
        after = "".join(c["text"] for c in client.generate("hello", timeout_s=30))  # goes on
    for got, n in ((chunks, 3), (achunks, 2)):
        for index in range(n):
            mine = [c for c in got if c["index"] == index]
            assert "".join(c["text"] for c in mine) == "t0 t1 t2 "
            assert mine[-1]["finish_reason"] == "length"
    assert after == "t0 t1 t2 "
    assert [r.n for r in worker.requests] == [3, 2, 1]


def test_a_request_too_big_to_forward_is_refused_alone_and_the_call_goes_on(
    start_controller, make_worker
):
    """A prompt that fits the client's message to the controller but not, with the request id
    the controller adds, the worker's receive limit: it used to end the worker's multiplexed
    call and every stream on it."""
    server, worker = ready(start_controller, make_worker, num_tokens=20, token_delay_s=0.05)
    with ControllerClient(server.address, credentials=PLAINTEXT) as client:
        running = client.generate("hello", max_tokens=20, timeout_s=30)
        texts = [next(running)["text"]]
        with pytest.raises(ClientError) as error:
            list(client.generate("x" * (MAX_REQUEST_BYTES - 40), max_tokens=1, timeout_s=30))
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith("prompt: the request is ")
        texts += [c["text"] for c in running]
    assert "".join(texts) == "".join(f"t{k} " for k in range(20))
    assert worker.num_requests == 1


def test_leaving_a_stream_early_cancels_it_on_the_worker(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)
    with ControllerClient(server.address, credentials=PLAINTEXT) as client:
        stream = client.generate("hello", timeout_s=30)
        assert next(stream)["token_ids"] == [1]
        assert not worker.cancelled.is_set()
        stream.close()
        assert worker.cancelled.wait(5), "the worker never saw the cancel"
    eventually(
        lambda: server.deployment.registry.get("w0").num_outstanding == 0,
        what="the request released",
    )


def test_the_deadline_is_the_controllers_and_counted_as_such(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)
    client = ControllerClient(server.address, credentials=PLAINTEXT)
    with client, pytest.raises(grpc.RpcError) as error:
        list(client.generate("hello", timeout_s=0.5))
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert worker.cancelled.wait(5), "the worker never saw the deadline"
    deadline = {
        "deployment": DEPLOYMENT,
        "model_name": server.deployment.desired.model,
        "status": "deadline_exceeded",
        "finish_reason": "",
    }
    eventually(
        lambda: server.metrics.get_sample_value("intentserve_requests_total", deadline) == 1,
        what="the request counted as deadline_exceeded",
    )


def test_a_refusal_reads_as_its_own_calls_would(start_controller):
    server, _ = start_controller(paged_attention="on")
    with ControllerClient(server.address, credentials=PLAINTEXT) as client:
        with pytest.raises(grpc.RpcError) as error:
            list(client.generate("hello", timeout_s=5))
        # the client's call survives a refused request: the next one is refused the same way
        with pytest.raises(grpc.RpcError) as again:
            list(client.generate("hello", timeout_s=5))
    for refused in (error.value, again.value):
        assert refused.code() is grpc.StatusCode.UNAVAILABLE
        assert refused.details() == (
            "deployment is not ready: not_enough_replicas: 0 of 1 required replicas verified"
        )


GREEDY = dict(chat=False, max_tokens=8, temperature=0.0, top_k=0, top_p=0.0, seed=None)
GREEDY |= dict(stop=None, ignore_eos=False)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("max_tokens", -1, "an integer from 0 to 4294967295"),
        ("max_tokens", 2**32, "an integer from 0 to 4294967295"),
        ("top_k", -1, "an integer from 0 to 4294967295"),
        ("seed", -5, f"an integer from 0 to {2**64 - 1}"),
        ("seed", 2**64, f"an integer from 0 to {2**64 - 1}"),
    ],
)
def test_a_value_the_request_cannot_carry_is_refused_naming_its_field(field, value, allowed):
    with pytest.raises(ValueError) as error:
        generate_request("hello", **(GREEDY | {field: value}))
    assert str(error.value) == f"{field}: {value}; allowed: {allowed}"
    # the edges themselves are carried (0 and the largest: the worker judges their meaning)
    edge = 2**64 - 1 if field == "seed" else 2**32 - 1
    for ok in (0, edge):
        request = generate_request("hello", **(GREEDY | {field: ok}))
        carried = request.stop if field == "max_tokens" else request.sampling
        assert getattr(carried, field) == ok


@pytest.mark.parametrize("timeout_s", [-1.0, 0, float("nan"), float("inf"), "5"])
def test_a_timeout_that_is_no_deadline_is_refused_naming_it_before_any_call(timeout_s):
    """Not a DEADLINE_EXCEEDED after a wait: the value is wrong, and nothing reaches a controller
    (there is none at this address)."""
    allowed = "allowed: finite seconds > 0, or None for no deadline"
    with (
        ControllerClient("127.0.0.1:1", credentials=PLAINTEXT) as client,
        pytest.raises(RequestValueError) as error,
    ):
        next(client.generate("hello", timeout_s=timeout_s))
    assert str(error.value) == f"timeout_s: {timeout_s!r}; {allowed}"

    async def agenerate():
        async with AsyncControllerClient("127.0.0.1:1", credentials=PLAINTEXT) as client:
            async for _ in client.generate("hello", timeout_s=timeout_s):
                pass

    with pytest.raises(RequestValueError) as error:
        asyncio.run(agenerate())
    assert str(error.value) == f"timeout_s: {timeout_s!r}; {allowed}"


def test_a_closed_client_refuses_to_generate(start_controller, make_worker):
    server, _ = ready(start_controller, make_worker, num_tokens=2)
    client = ControllerClient(server.address, credentials=PLAINTEXT)
    assert (
        sum(len(c["token_ids"]) for c in client.generate("hello", max_tokens=2, timeout_s=30)) == 2
    )
    client.close()
    client.close()  # twice is harmless
    with pytest.raises(ValueError, match="closed"):
        next(client.generate("hello", max_tokens=2))


def test_closing_the_client_ends_the_streams_still_running(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)
    client = ControllerClient(server.address, credentials=PLAINTEXT)
    stream = client.generate("hello", timeout_s=30)
    assert next(stream)["token_ids"] == [1]
    client.close()
    with pytest.raises(grpc.RpcError) as error:
        next(stream)
    assert error.value.code() is grpc.StatusCode.CANCELLED
    assert worker.cancelled.wait(5), "closing the client did not cancel its request"


def test_closing_while_threads_start_streams_leaves_none_of_them_waiting(stand_in):
    address = stand_in(CountingInference(num_tokens=3))
    client = ControllerClient(address, credentials=PLAINTEXT)
    outcomes: list[object] = []

    def run() -> None:
        for _ in range(200):  # no timeout_s: a stream the close missed would wait for ever
            try:
                list(client.generate("p", max_tokens=3))
                outcomes.append("ok")
            except ValueError:
                outcomes.append("closed")
                return
            except grpc.RpcError as error:
                outcomes.append(error.code())

    threads = [threading.Thread(target=run, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    eventually(lambda: outcomes.count("ok") >= 8, what="streams running")
    client.close()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads), "a stream outlived its client"
    assert outcomes.count("closed") == 8
    assert set(outcomes) <= {"ok", "closed", grpc.StatusCode.CANCELLED}


def test_a_hand_off_to_a_stopped_or_closed_loop_says_the_client_is_closed():
    from intentserve.client.sync import LoopThread

    stopped = LoopThread()
    assert stopped.call(lambda: 42) == 42
    stopped.soon(stopped._loop.stop)  # stopped, not yet closed: what a racing close leaves
    stopped._thread.join(5)
    with pytest.raises(ValueError, match="the client is closed"):
        stopped.call(lambda: 1)
    stopped.close()
    with pytest.raises(ValueError, match="the client is closed"):
        stopped.call(lambda: 1)
