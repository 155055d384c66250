"""`AsyncControllerClient` and `Inference.GenerateMany` against a real controller and scripted
workers: the chunks the blocking client gives, many streams on one call, leaving a stream early
or its deadline reaching the worker, each request's refusal its own, bad commands named."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from intentserve.client import AsyncControllerClient, ControllerClient
from intentserve.policy import examples
from intentserve.v1 import inference_pb2, inference_pb2_grpc

from tests.controller.conftest import DEPLOYMENT, PLAINTEXT, eventually, ready
from tests.controller.scripted_worker import Behaviour

pytestmark = pytest.mark.integration


def whole(chunks: list[dict]) -> dict:
    """A stream's chunks read as one: lists appended, text concatenated, the last chunk's other
    fields (the router's merge rules), the request id aside."""
    merged: dict = {}
    for chunk in chunks:
        for key, value in chunk.items():
            if isinstance(value, list):
                merged[key] = merged.get(key, []) + value
            elif key == "text":
                merged[key] = merged.get(key, "") + value
            else:
                merged[key] = value
    return {**merged, "request_id": ""}


async def collect(client: AsyncControllerClient, **kwargs) -> list[dict]:
    return [chunk async for chunk in client.generate("hello", **kwargs)]


def test_a_stream_gives_the_chunks_the_blocking_client_gives(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, num_tokens=4)

    async def main() -> tuple[list[dict], dict, str]:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            return await collect(client, max_tokens=4), await client.status(), await client.health()

    chunks, status, health = asyncio.run(main())
    with ControllerClient(server.address, credentials=PLAINTEXT) as blocking:
        expected = list(blocking.generate("hello", max_tokens=4))
    assert "".join(c["text"] for c in chunks) == "t0 t1 t2 t3 "
    assert chunks[-1]["finish_reason"] == "length"
    # chunks that wait in the router may leave it as one, so the two compare whole
    assert whole(chunks) == whole(expected)
    assert status["state"] == "ready" and status["deployment"] == DEPLOYMENT
    assert health == "serving"
    assert worker.num_requests == 2
    # Each request on the shared call is metered as its own Generate call is.
    ok = {"status": "ok", "finish_reason": "length"}
    requests = server.metrics.get_sample_value("intentserve_requests_total", labels(server, ok))
    tokens = server.metrics.get_sample_value(
        "intentserve_generation_tokens_total", labels(server, {})
    )
    assert (requests, tokens) == (2, 8)


def labels(server, extra: dict[str, str]) -> dict[str, str]:
    return {"deployment": DEPLOYMENT, "model_name": server.deployment.desired.model, **extra}


def test_64_streams_on_one_event_loop_all_finish_in_order(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, num_tokens=12, token_delay_s=0.005)

    async def main() -> list[str]:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            runs = [collect(client, max_tokens=12, timeout_s=30) for _ in range(64)]
            return ["".join(c["text"] for c in chunks) for chunks in await asyncio.gather(*runs)]

    assert asyncio.run(main()) == ["".join(f"t{k} " for k in range(12))] * 64
    assert worker.num_requests == 64
    assert worker.num_serve_calls == 1


def test_leaving_a_stream_early_cancels_it_on_the_worker(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)

    async def main() -> dict:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            stream = client.generate("hello", timeout_s=30)
            first = await anext(stream)
            assert not worker.cancelled.is_set()
            await stream.aclose()
            return first

    assert asyncio.run(main())["token_ids"] == [1]
    assert worker.cancelled.wait(5), "the worker never saw the cancel"
    eventually(
        lambda: server.deployment.registry.get("w0").num_outstanding == 0,
        what="the request released",
    )


def test_the_deadline_ends_the_stream_and_reaches_the_worker(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)

    async def main() -> None:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            await collect(client, timeout_s=0.5)

    with pytest.raises(grpc.RpcError) as error:
        asyncio.run(main())
    assert error.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert worker.cancelled.wait(5), "the worker never saw the deadline"
    deadline = labels(server, {"status": "deadline_exceeded", "finish_reason": ""})
    eventually(
        lambda: server.metrics.get_sample_value("intentserve_requests_total", deadline) == 1,
        what="the request counted as deadline_exceeded",
    )


def test_not_ready_fails_each_request_with_the_readiness_reason(start_controller):
    server, _ = start_controller(paged_attention="on")

    async def main() -> None:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            await collect(client, timeout_s=5)

    with pytest.raises(grpc.RpcError) as error:
        asyncio.run(main())
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert error.value.details() == (
        "deployment is not ready: not_enough_replicas: 0 of 1 required replicas verified"
    )


def test_a_refused_request_leaves_the_others_on_the_call_running(start_controller, make_worker):
    server, _ = start_controller(paged_attention="on", max_outstanding_per_worker=1, max_queued=0)
    worker = make_worker(server, "w0", examples.cpu(), behaviour=Behaviour.BLOCK)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")

    async def main() -> grpc.StatusCode:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            running = client.generate("first", timeout_s=30)
            assert (await anext(running))["token_ids"] == [1]
            with pytest.raises(grpc.RpcError) as refused:
                await collect(client, timeout_s=30)
            assert not worker.cancelled.is_set()  # the first is still served
            await running.aclose()
            return refused.value.code()

    assert asyncio.run(main()) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert worker.cancelled.wait(5), "the worker never saw the first request's cancel"


def test_bad_commands_fail_their_key_by_name_and_the_call_goes_on(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, behaviour=Behaviour.BLOCK)
    start = inference_pb2.GenerateRequest(prompt="hi")

    async def main() -> dict[int, tuple[int, str]]:
        async with grpc.aio.insecure_channel(server.address) as channel:
            call = inference_pb2_grpc.InferenceStub(channel).GenerateMany()
            for command in (
                inference_pb2.GenerateCommand(stream=1),
                inference_pb2.GenerateCommand(stream=2, start=start, timeout_s=-1),
                inference_pb2.GenerateCommand(stream=3, start=start),
                inference_pb2.GenerateCommand(stream=3, start=start),
                inference_pb2.GenerateCommand(stream=4, start=start, timeout_s=float("nan")),
            ):
                await call.write(command)
            errors: dict[int, tuple[int, str]] = {}
            outputs = 0
            while len(errors) < 4 or not outputs:
                for event in (await call.read()).events:
                    if event.HasField("error"):
                        errors[event.stream] = (event.error.code, event.error.details)
                    else:
                        outputs += 1
            call.cancel()
            return errors

    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert asyncio.run(main()) == {
        1: (invalid, "command: set start or cancel"),
        2: (invalid, "timeout_s: -1.0; allowed: finite seconds >= 0 (0: none)"),
        4: (invalid, "timeout_s: nan; allowed: finite seconds >= 0 (0: none)"),
        3: (invalid, "stream: key 3 is in use"),
    }
    assert worker.cancelled.wait(5), "ending the call did not cancel its request"


def test_a_command_that_does_not_parse_ends_the_call_naming_it(start_controller, make_worker):
    server, _ = ready(start_controller, make_worker)

    async def main() -> None:
        async with grpc.aio.insecure_channel(server.address) as channel:
            call = channel.stream_stream(
                "/intentserve.v1.Inference/GenerateMany",
                request_serializer=lambda data: data,
                response_deserializer=inference_pb2.GenerateEvents.FromString,
            )()
            await call.write(b"\x12\x05\x12\x03\xff\xfe\xfd")  # start.prompt: not UTF-8
            await call.read()

    with pytest.raises(grpc.RpcError) as error:
        asyncio.run(main())
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt" in error.value.details()


def test_a_closed_client_refuses_to_generate(start_controller, make_worker):
    server, _ = ready(start_controller, make_worker, num_tokens=2)

    async def main() -> None:
        client = AsyncControllerClient(server.address, credentials=PLAINTEXT)
        assert len(await collect(client, max_tokens=2, timeout_s=30)) == 2
        await client.close()
        await client.close()  # twice is harmless
        with pytest.raises(ValueError, match="the client is closed"):
            await collect(client, max_tokens=2)

    asyncio.run(main())
