"""`AsyncControllerClient` against a real controller and scripted workers: the chunks the
blocking client gives, many streams on one event loop, leaving a stream early or its deadline
reaching the worker."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from intentserve.controller.cli.client import AsyncControllerClient, ControllerClient
from intentserve.controller.cli.credentials import Credentials
from intentserve.policy import examples

from tests.controller.conftest import DEPLOYMENT, eventually
from tests.controller.scripted_worker import Behaviour

pytestmark = pytest.mark.integration

PLAINTEXT = Credentials(DEPLOYMENT)


def ready(start_controller, make_worker, **worker_kwargs):
    server, _ = start_controller(paged_attention="on", max_outstanding_per_worker=64)
    worker = make_worker(server, "w0", examples.cpu(), **worker_kwargs)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    return server, worker


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
    assert [c["text"] for c in chunks] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert chunks[-1]["finish_reason"] == "length"
    assert [{**c, "request_id": ""} for c in chunks] == [{**c, "request_id": ""} for c in expected]
    assert status["state"] == "ready" and status["deployment"] == DEPLOYMENT
    assert health == "serving"
    assert worker.num_requests == 2


def test_64_streams_on_one_event_loop_all_finish_in_order(start_controller, make_worker):
    server, worker = ready(start_controller, make_worker, num_tokens=12, token_delay_s=0.005)

    async def main() -> list[list[str]]:
        async with AsyncControllerClient(server.address, credentials=PLAINTEXT) as client:
            runs = [collect(client, max_tokens=12, timeout_s=30) for _ in range(64)]
            return [[c["text"] for c in chunks] for chunks in await asyncio.gather(*runs)]

    assert asyncio.run(main()) == [[f"t{k} " for k in range(12)]] * 64
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
