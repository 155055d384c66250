"""Request metrics as the router's responses pass through, and the HTTP call the router sees;
no server."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from intentserve.controller.errors import NotReady, Overloaded
from intentserve.controller.router.http.bridge import HttpCall
from intentserve.controller.router.request_metrics import RequestMetrics
from intentserve.controller.router.token_gaps import FLUSH_TOKENS, TokenGaps
from intentserve.policy import Reason, ReasonCode
from intentserve.v1 import inference_pb2
from prometheus_client import CollectorRegistry

LABELS = {"deployment": "d", "model_name": "m"}


@pytest.fixture
def metered():
    registry = CollectorRegistry()
    return registry, RequestMetrics(registry, deployment="d", model="m")


def value(registry: CollectorRegistry, name: str, **labels) -> float:
    return registry.get_sample_value(name, {**LABELS, **labels}) or 0.0


def stream(num_tokens: int, finish: int | None, fail: Exception | None = None):
    for i in range(num_tokens):
        last = i == num_tokens - 1
        yield inference_pb2.GenerateResponse(
            token_ids=[i],
            num_output_tokens=i + 1,
            finish_reason=finish if last and finish else 0,
            num_prompt_tokens=7 if last and finish else 0,
        )
    if fail is not None:
        raise fail


async def astream(num_tokens: int, finish: int | None, fail: Exception | None = None):
    for response in stream(num_tokens, finish, fail):
        yield response


async def collect(responses) -> list:
    return [r async for r in responses]


async def pause(seconds: float) -> None:
    """At least `seconds` by the metrics' clock (time.perf_counter): a loop's timer may fire a
    hair before its time by that clock (uvloop's asyncio.sleep(0.01) took 9.2 ms by it)."""
    until_s = time.perf_counter() + seconds
    while (left_s := until_s - time.perf_counter()) > 0:
        await asyncio.sleep(left_s)


def test_a_finished_request_counts_its_tokens_and_latencies(metered):
    registry, metrics = metered
    observed = metrics.aobserve(astream(4, inference_pb2.FINISH_REASON_LENGTH))
    assert len(asyncio.run(collect(observed))) == 4
    assert value(registry, "intentserve_requests_total", status="ok", finish_reason="length") == 1
    assert value(registry, "intentserve_prompt_tokens_total") == 7
    assert value(registry, "intentserve_generation_tokens_total") == 4
    assert value(registry, "intentserve_time_to_first_token_seconds_count") == 1
    assert value(registry, "intentserve_inter_token_latency_seconds_count") == 3
    assert value(registry, "intentserve_e2e_request_latency_seconds_count") == 1


def test_n_choices_count_every_choices_tokens_and_the_prompt_once(metered):
    registry, metrics = metered

    async def choices():
        for one, two in zip(stream(3, 1), stream(3, 1), strict=True):
            two.index = 1
            yield one
            yield two

    assert len(asyncio.run(collect(metrics.aobserve(choices())))) == 6
    assert value(registry, "intentserve_requests_total", status="ok", finish_reason="stop") == 1
    assert value(registry, "intentserve_prompt_tokens_total") == 7
    assert value(registry, "intentserve_generation_tokens_total") == 6


def test_every_gap_between_tokens_is_counted_in_its_bucket_with_its_time(metered):
    # Gaps of ~30 ms, then one response of three tokens ~90 ms after: three gaps of ~30 ms.
    registry, metrics = metered

    async def paced():
        yield inference_pb2.GenerateResponse(token_ids=[0], num_output_tokens=1)
        for i in range(1, 4):
            await pause(0.03)
            yield inference_pb2.GenerateResponse(token_ids=[i], num_output_tokens=i + 1)
        await pause(0.09)
        yield inference_pb2.GenerateResponse(
            token_ids=[4, 5, 6], num_output_tokens=7, finish_reason=inference_pb2.FINISH_REASON_STOP
        )

    asyncio.run(collect(metrics.aobserve(paced())))
    name = "intentserve_inter_token_latency_seconds"
    assert value(registry, f"{name}_count") == 6  # every token but the first
    assert value(registry, f"{name}_bucket", le="0.025") == 0
    assert value(registry, f"{name}_bucket", le="0.075") == 6
    assert value(registry, f"{name}_bucket", le="+Inf") == 6
    assert 0.18 <= value(registry, f"{name}_sum") < 0.3


def test_a_running_requests_gaps_reach_a_scrape_every_flush(metered):
    registry, metrics = metered
    name = "intentserve_inter_token_latency_seconds_count"

    async def scenario():
        observed = metrics.aobserve(astream(FLUSH_TOKENS + 10, inference_pb2.FINISH_REASON_LENGTH))
        for _ in range(FLUSH_TOKENS):  # the first token and FLUSH_TOKENS - 1 gaps
            await anext(observed)
        assert value(registry, name) == 0
        await anext(observed)
        assert value(registry, name) == FLUSH_TOKENS
        await observed.aclose()

    asyncio.run(scenario())
    assert value(registry, name) == FLUSH_TOKENS  # closed before its next token


def test_a_request_is_split_into_queue_prefill_and_decode_and_its_tokens_counted(metered):
    registry, metrics = metered

    async def queued_then_streamed():
        await pause(0.05)
        metrics.queue_wait_times.observe(0.05)  # as the admission queue does, in this task
        await pause(0.02)  # the prefill
        for i, response in enumerate(stream(3, inference_pb2.FINISH_REASON_STOP)):
            if i:
                await pause(0.01)
            yield response

    asyncio.run(collect(metrics.aobserve(queued_then_streamed())))
    ttft = value(registry, "intentserve_time_to_first_token_seconds_sum")
    prefill = value(registry, "intentserve_request_prefill_time_seconds_sum")
    decode = value(registry, "intentserve_request_decode_time_seconds_sum")
    assert value(registry, "intentserve_request_queue_time_seconds_sum") == 0.05
    assert 0.02 <= prefill < ttft - 0.04  # the queue's 50 ms are not prefill
    assert 0.02 <= decode < 0.2  # two gaps of 10 ms
    assert value(registry, "intentserve_request_prompt_tokens_sum") == 7
    assert value(registry, "intentserve_request_prompt_tokens_bucket", le="10.0") == 1
    assert value(registry, "intentserve_request_prompt_tokens_bucket", le="5.0") == 0
    assert value(registry, "intentserve_request_generation_tokens_sum") == 3


def test_a_request_that_never_finished_has_no_token_or_decode_observation(metered):
    registry, metrics = metered
    with pytest.raises(Overloaded):
        asyncio.run(collect(metrics.aobserve(astream(2, None, fail=Overloaded("full")))))
    assert value(registry, "intentserve_request_prefill_time_seconds_count") == 1
    assert value(registry, "intentserve_request_decode_time_seconds_count") == 0
    assert value(registry, "intentserve_request_prompt_tokens_count") == 0


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotReady(Reason(ReasonCode.WORKER_PENDING, "loading")), "unavailable"),
        (Overloaded("full"), "resource_exhausted"),
    ],
)
def test_a_refused_request_counts_with_the_status_its_client_got(metered, error, status):
    registry, metrics = metered
    with pytest.raises(type(error)):
        asyncio.run(collect(metrics.aobserve(astream(0, None, fail=error))))
    assert value(registry, "intentserve_requests_total", status=status, finish_reason="") == 1
    assert value(registry, "intentserve_e2e_request_latency_seconds_count") == 0


def test_a_consumer_that_stops_early_is_cancelled_and_its_routed_call_closed(metered):
    registry, metrics = metered
    upstream = astream(10, inference_pb2.FINISH_REASON_LENGTH)

    async def scenario():
        observed = metrics.aobserve(upstream)
        await anext(observed), await anext(observed)
        await observed.aclose()

    asyncio.run(scenario())
    assert upstream.ag_frame is None  # the router's generator ran its cleanup
    assert value(registry, "intentserve_requests_total", status="cancelled", finish_reason="") == 1
    assert value(registry, "intentserve_generation_tokens_total") == 2


def test_a_stream_that_ends_without_a_finish_reason_was_cancelled(metered):
    registry, metrics = metered
    asyncio.run(collect(metrics.aobserve(astream(2, None))))
    assert value(registry, "intentserve_requests_total", status="cancelled", finish_reason="") == 1


def test_a_cancelled_task_is_counted_and_closes_the_routed_call(metered):
    # A client's cancel arrives as CancelledError while the handler awaits the next response.
    registry, metrics = metered
    closed: list[bool] = []

    async def upstream():
        try:
            yield inference_pb2.GenerateResponse(token_ids=[1], num_output_tokens=1)
            await asyncio.sleep(10)
        finally:
            closed.append(True)

    async def scenario():
        task = asyncio.ensure_future(collect(metrics.aobserve(upstream())))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert closed == [True]
    assert value(registry, "intentserve_requests_total", status="cancelled", finish_reason="") == 1
    assert value(registry, "intentserve_generation_tokens_total") == 1


class Call:
    """What the metrics read of a call: the time left before its deadline (None: none) and its
    code (grpc's stays None when its core ends the call; a front end that enforces the deadline
    itself sets DEADLINE_EXCEEDED)."""

    def __init__(self, remaining_s: float | None, code: grpc.StatusCode | None = None) -> None:
        self.remaining_s = remaining_s
        self._code = code

    def time_remaining(self) -> float | None:
        return self.remaining_s

    def code(self) -> grpc.StatusCode | None:
        return self._code


HAIR_S = 0.0003  # uvloop's timer for a deadline fired this long before the clock read 0
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("remaining_s", "code", "status"),
    [
        (0.0, None, "deadline_exceeded"),
        (5.0, None, "cancelled"),
        (None, None, "cancelled"),
        (2.0**63, None, "cancelled"),
        (HAIR_S, DEADLINE, "deadline_exceeded"),  # the front end's own timer ended it
        (HAIR_S, None, "cancelled"),  # time left, and no deadline ended it: the client's cancel
    ],
)
def test_a_request_ended_by_its_deadline_counts_as_deadline_exceeded(
    metered, remaining_s, code, status
):
    # A deadline, like a client's cancel, ends the handler's stream early or cancels its task;
    # the client got DEADLINE_EXCEEDED, so that is the status counted (grpc's "no deadline" is
    # about 2**63 seconds left).
    registry, metrics = metered
    call = Call(remaining_s, code)
    asyncio.run(collect(metrics.aobserve(astream(2, None), call)))

    async def cancelled_task():
        task = asyncio.ensure_future(collect(metrics.aobserve(astream_forever(), call)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_task())
    assert value(registry, "intentserve_requests_total", status=status, finish_reason="") == 2


async def astream_forever():
    yield inference_pb2.GenerateResponse(token_ids=[1], num_output_tokens=1)
    await asyncio.sleep(10)


def test_an_http_call_runs_the_routers_callbacks_once_when_cancelled():
    call = HttpCall()
    ran: list[str] = []
    assert call.time_remaining() is None and not call.cancelled()
    assert call.add_callback(lambda: ran.append("upstream"))
    call.cancel()
    call.cancel()
    assert ran == ["upstream"] and call.cancelled()
    assert not call.add_callback(lambda: ran.append("late"))  # the router then cancels itself
    assert ran == ["upstream"]


def test_the_gap_histograms_name_is_its_own_in_a_registry():
    registry = CollectorRegistry()
    labels = {"deployment": "d", "model_name": "m"}
    TokenGaps(registry, "gaps_seconds", "gaps", labels=labels, buckets=(0.1, 1.0))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        TokenGaps(registry, "gaps_seconds", "gaps again", labels=labels, buckets=(0.1, 1.0))
