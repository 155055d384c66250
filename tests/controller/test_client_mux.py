"""`ClientStreams` (the controller's side of `Inference.GenerateMany`) on a router stand-in:
what the requests produce together leaves in one message; a request's deadline and the call's
end are kept."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from intentserve.common.field_errors import FieldViolation, violation_in
from intentserve.controller.errors import UpstreamError
from intentserve.controller.router.client_mux import ClientStreams
from intentserve.controller.router.request_metrics import MeteredRouter, RequestMetrics
from intentserve.v1 import inference_pb2
from prometheus_client import CollectorRegistry

from tests.controller.early_loop import EarlyLoop


class StepRouter:
    """Every request yields one token per `step()`, all in the same turn of the loop; the
    request with prompt "slow" never yields."""

    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.step_event = asyncio.Event()
        self.closed: list[str] = []

    def step(self) -> None:
        self.step_event.set()
        self.step_event = asyncio.Event()

    async def agenerate(self, request, context):
        try:
            if request.prompt == "slow":
                await asyncio.Event().wait()
            for i in range(self.num_tokens):
                await self.step_event.wait()
                reason = inference_pb2.FINISH_REASON_LENGTH if i == self.num_tokens - 1 else 0
                yield inference_pb2.GenerateResponse(
                    request_id=request.request_id, token_ids=[i], finish_reason=reason
                )
        finally:
            self.closed.append(request.request_id)


async def commands(queue: asyncio.Queue):
    while (command := await queue.get()) is not None:
        yield command


def start(key: int, prompt: str = "hi", timeout_s: float = 0.0) -> inference_pb2.GenerateCommand:
    request = inference_pb2.GenerateRequest(request_id=f"r{key}", prompt=prompt)
    return inference_pb2.GenerateCommand(stream=key, start=request, timeout_s=timeout_s)


def test_a_steps_tokens_for_every_request_leave_in_one_message():
    async def main() -> list[list[tuple[int, list[int]]]]:
        router, queue = StepRouter(num_tokens=3), asyncio.Queue()
        for key in range(1, 9):
            queue.put_nowait(start(key))
        messages = []
        served = ClientStreams(router).serve(commands(queue))
        reader = asyncio.ensure_future(anext(served))
        for _ in range(3):
            await asyncio.sleep(0.01)  # every request is waiting for the step
            router.step()
            messages.append(await reader)
            reader = asyncio.ensure_future(anext(served))
        queue.put_nowait(None)  # the client is done writing: the call ends
        with contextlib.suppress(StopAsyncIteration):
            await reader
        return [[(e.stream, list(e.output.token_ids)) for e in m.events] for m in messages]

    messages = asyncio.run(main())
    assert [sorted(m) for m in messages] == [[(k, [i]) for k in range(1, 9)] for i in range(3)]


def test_a_deadline_fails_its_request_only_and_the_call_end_closes_the_rest():
    async def main():
        router, queue = StepRouter(num_tokens=1), asyncio.Queue()
        queue.put_nowait(start(1, "slow", timeout_s=0.05))
        queue.put_nowait(start(2, "slow"))
        served = ClientStreams(router).serve(commands(queue))
        message = await anext(served)
        await served.aclose()  # the call ended (the client went away)
        await asyncio.sleep(0)
        return message, router.closed

    message, closed = asyncio.run(main())
    (event,) = message.events
    assert event.stream == 1
    assert event.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert event.error.details == "deadline exceeded"
    assert sorted(closed) == ["r1", "r2"]


def ended_on_an_early_loop(*commands_in: inference_pb2.GenerateCommand) -> dict[str, float]:
    """Run `commands_in` (10 ms apart) on a metered StepRouter (requests "slow" never yield), on
    a loop whose timers fire early by any clock but its own, until each request has ended; the
    requests counted, by status."""
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, deployment="d", model="m")
    router = StepRouter(num_tokens=1)

    async def main() -> None:
        queue = asyncio.Queue()
        served = ClientStreams(MeteredRouter(router, metrics)).serve(commands(queue))
        reader = asyncio.ensure_future(collect_all(served))
        for command in commands_in:
            queue.put_nowait(command)
            await asyncio.sleep(0.01)
        queue.put_nowait(None)  # the client is done writing: the call ends with its requests
        await reader

    loop = EarlyLoop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 5))
    finally:
        loop.close()
    labels = {"deployment": "d", "model_name": "m", "finish_reason": ""}
    counted = {}
    for status in ("deadline_exceeded", "cancelled"):
        value = registry.get_sample_value("intentserve_requests_total", labels | {"status": status})
        counted[status] = value or 0.0
    return counted


async def collect_all(served) -> None:
    async with contextlib.aclosing(served) as messages:
        async for _ in messages:
            pass


def test_a_deadline_the_controller_enforced_is_counted_as_such_though_its_timer_fired_early():
    # A GenerateMany request's deadline is the controller's own timer. On a loop whose timers
    # fire early by other clocks (uvloop: its clock is read once per iteration, in whole ms),
    # the request's time left by such a clock is still a hair above 0 when the timer ends it:
    # it is the deadline all the same, the code its client gets.
    counted = ended_on_an_early_loop(start(1, "slow", timeout_s=0.05))
    assert counted == {"deadline_exceeded": 1.0, "cancelled": 0.0}


def test_a_cancel_command_before_the_deadline_is_counted_as_cancelled():
    cancel = inference_pb2.GenerateCommand(stream=1, cancel=True)
    counted = ended_on_an_early_loop(start(1, "slow", timeout_s=30), cancel)
    assert counted == {"deadline_exceeded": 0.0, "cancelled": 1.0}


class FieldRefusingRouter:
    """Refuses every request as a worker refuses a field: INVALID_ARGUMENT with its violation."""

    async def agenerate(self, request, context):
        raise UpstreamError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "sampling.top_p: 1.5 is outside (0, 1]",
            FieldViolation("sampling.top_p", "1.5 is outside (0, 1]"),
        )
        yield  # an async generator, as the router's is


def test_a_refused_fields_error_event_carries_its_bad_request_detail():
    async def main():
        queue = asyncio.Queue()
        queue.put_nowait(start(1))
        served = ClientStreams(FieldRefusingRouter()).serve(commands(queue))
        message = await anext(served)
        await served.aclose()
        return message

    (event,) = asyncio.run(main()).events
    assert event.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert event.error.details == "sampling.top_p: 1.5 is outside (0, 1]"
    assert violation_in(event.error.status_details) == FieldViolation(
        "sampling.top_p", "1.5 is outside (0, 1]"
    )


class RefusingRouter:
    """Refuses every request at once (as a deployment that is not ready does)."""

    async def agenerate(self, request, context):
        from intentserve.controller.errors import Overloaded

        raise Overloaded("every READY worker's queue is full")
        yield  # an async generator, as the router's is


def test_a_client_that_writes_without_reading_stops_being_read():
    # Each refused start becomes an error event; a client that never reads them must not make
    # the controller hold more and more of them: past a bound, its commands wait unread (grpc's
    # flow control then holds the client's writes).
    pulled = 0

    async def flood():
        nonlocal pulled
        for key in range(1, 100_001):
            pulled += 1
            yield start(key)

    async def main() -> tuple[int, int]:
        streams = ClientStreams(RefusingRouter())
        served = streams.serve(flood())
        first = await anext(served)  # then the client stops reading
        for _ in range(200):
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        held = len(streams._pending)
        await served.aclose()
        return len(first.events), held

    first, held = asyncio.run(main())
    bound = ClientStreams.MAX_PENDING_EVENTS
    assert 1 <= first <= bound
    assert held <= bound
    assert pulled <= 2 * bound + 2  # what the first message carried, then the bound again


def test_a_cancel_goes_through_while_there_is_no_room_and_makes_room(monkeypatch):
    monkeypatch.setattr(ClientStreams, "MAX_PENDING_EVENTS", 2)

    async def main() -> tuple[list[str], list[int]]:
        router, queue = StepRouter(num_tokens=1), asyncio.Queue()
        queue.put_nowait(start(1, "slow"))
        queue.put_nowait(start(2, "slow"))  # no room after this one: two requests run
        streams = ClientStreams(router)
        served = streams.serve(commands(queue))
        reader = asyncio.ensure_future(anext(served))
        await asyncio.sleep(0.02)
        queue.put_nowait(inference_pb2.GenerateCommand(stream=1, cancel=True))
        queue.put_nowait(start(3, "slow"))
        await asyncio.sleep(0.05)
        closed, running = list(router.closed), sorted(streams._tasks)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await served.aclose()
        return closed, running

    closed, running = asyncio.run(main())
    assert closed == ["r1"]  # the cancel was read with no room, and ended request 1
    assert running == [2, 3]  # which made room for the next start
