"""What every routed request costs and how it ended, measured where the router hands its responses
to a front end, so that gRPC and HTTP requests are measured by the same code.

    metered = MeteredRouter(router, RequestMetrics(registry, deployment="local", model="smollm2"))
    async for response in metered.agenerate(request, context): ...   # as Router.agenerate

Names and buckets follow vLLM's (`vllm:time_to_first_token_seconds` is
`intentserve_time_to_first_token_seconds` here). A request's final status is the gRPC status code
its client saw (the controller's one exception -> status table), in lower case: `ok`,
`invalid_argument`, `unavailable`, `resource_exhausted`, `cancelled` (the client went away), ...
The router's admission queue reports here too: its length at each scrape, and each request's time
in it (`intentserve_request_queue_time_seconds`, vLLM's `request_queue_time_seconds`).

A request's time is split as vLLM splits it, measured here: queue (waiting for a worker slot),
prefill (from taking a slot to the first token: the worker's own wait, if any, and the prompt's
forward pass) and decode (first token to last); its prompt and generated token counts go to
histograms too, for finished requests.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
from intentserve.common.status import lookup
from intentserve.controller.router.admission import AdmissionQueue
from intentserve.controller.router.routing import Router, deadline_passed
from intentserve.controller.router.token_gaps import GapBatch, TokenGaps
from intentserve.controller.status_codes import STATUS_CODES
from intentserve.v1 import inference_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LABELS = ("deployment", "model_name")
# vLLM's buckets.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75)
TTFT_BUCKETS_S += (1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
ITL_BUCKETS_S += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
E2E_BUCKETS_S += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# 1-2-5 steps, as vLLM's token histograms, to past the longest model length.
TOKEN_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))
FINISH_REASONS = {
    inference_pb2.FINISH_REASON_UNSPECIFIED: "",
    inference_pb2.FINISH_REASON_STOP: "stop",
    inference_pb2.FINISH_REASON_LENGTH: "length",
    inference_pb2.FINISH_REASON_ABORT: "abort",
    inference_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}

# NOTE: the admission queue observes a request's wait in the task that routes it, which is the
# task `aobserve` runs in (an async generator runs in its consumer's context): the wait is read
# back here to split the time to the first token into queue and prefill.
_QUEUE_WAIT_S: contextvars.ContextVar[float] = contextvars.ContextVar("queue_wait_s", default=0.0)

_CANCELLED = grpc.StatusCode.CANCELLED.name.lower()  # the client went away
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.name.lower()  # its deadline passed


def _status_of(error: Exception) -> str:
    """The `status` label of a request that ended with `error` (the code a client gets)."""
    return lookup(STATUS_CODES, error)[0].name.lower()


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry, *, deployment: str, model: str) -> None:
        self._labels = (deployment, model)
        self.requests = Counter(
            "intentserve_requests",
            "Routed requests by final status (the gRPC code, lower case) and finish reason",
            (*LABELS, "status", "finish_reason"),
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "intentserve_prompt_tokens",
            "Prompt tokens of finished requests",
            LABELS,
            registry=registry,
        )
        self.generation_tokens = Counter(
            "intentserve_generation_tokens",
            "Tokens generated, however the request ended",
            LABELS,
            registry=registry,
        )
        self.ttft_s = Histogram(
            "intentserve_time_to_first_token_seconds",
            "From routing to the first token",
            LABELS,
            registry=registry,
            buckets=TTFT_BUCKETS_S,
        )
        self.itl_s = TokenGaps(
            registry,
            "intentserve_inter_token_latency_seconds",
            "Between consecutive tokens of a stream",
            labels=dict(zip(LABELS, self._labels, strict=True)),
            buckets=ITL_BUCKETS_S,
        )
        self.e2e_s = Histogram(
            "intentserve_e2e_request_latency_seconds",
            "From routing to the last token (ok only)",
            LABELS,
            registry=registry,
            buckets=E2E_BUCKETS_S,
        )
        self.queue_time_s = Histogram(
            "intentserve_request_queue_time_seconds",
            "Time in the controller's admission queue waiting for a worker slot, however the "
            "wait ended (0: a slot was free)",
            LABELS,
            registry=registry,
            buckets=E2E_BUCKETS_S,
        )
        self.prefill_time_s = self._histogram(
            registry, "request_prefill_time_seconds", "From a worker slot to the first token"
        )
        self.decode_time_s = self._histogram(
            registry, "request_decode_time_seconds", "From the first token to the last (ok only)"
        )
        self.prompt_tokens_per_request = self._histogram(
            registry, "request_prompt_tokens", "Prompt tokens per finished request", TOKEN_BUCKETS
        )
        self.generation_tokens_per_request = self._histogram(
            registry,
            "request_generation_tokens",
            "Generated tokens per finished request",
            TOKEN_BUCKETS,
        )
        self.num_queued = Gauge(
            "intentserve_num_requests_queued",
            "Requests waiting in the controller's admission queue for a worker slot",
            LABELS,
            registry=registry,
        )
        self.queue_wait_times = _QueueWaits(self.queue_time_s.labels(*self._labels))
        self._ttft_s = self.ttft_s.labels(*self._labels)

    @staticmethod
    def _histogram(registry, name, doc, buckets=E2E_BUCKETS_S) -> Histogram:
        return Histogram(f"intentserve_{name}", doc, LABELS, registry=registry, buckets=buckets)

    def watch_queue(self, queue: AdmissionQueue) -> None:
        """The queue's length, read at each scrape."""
        self.num_queued.labels(*self._labels).set_function(lambda: queue.num_waiting)

    async def aobserve(
        self, responses: AsyncGenerator[inference_pb2.GenerateResponse, None], call=None
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Pass `responses` through, timing each token and counting how the request ended. A
        client that went away is `CancelledError` (the handler's task was cancelled) or a close
        of this generator; so is a deadline, counted as `deadline_exceeded` (the code its client
        got) when `call` (what has `time_remaining()`: the request's context) says it passed."""
        _QUEUE_WAIT_S.set(0.0)
        seen = _Seen(self.itl_s.batch())
        status = "ok"
        try:
            async for response in responses:
                if seen.add(response):
                    self._first_token(seen.first_token_s - seen.started_s)
                elif seen.gaps.full:
                    self.itl_s.add(seen.gaps)
                yield response
            if not seen.finish:
                status = _CANCELLED
        except (GeneratorExit, asyncio.CancelledError):
            status = _CANCELLED
            raise
        except Exception as error:
            status = _status_of(error)
            raise
        finally:
            await responses.aclose()  # NOTE: ends the routed call now (the worker's cancel)
            if status == _CANCELLED and call is not None and deadline_passed(call):
                status = _DEADLINE_EXCEEDED
            self._finished(status, seen)

    def _first_token(self, first_s: float) -> None:
        self._ttft_s.observe(first_s)
        prefill_s = max(first_s - _QUEUE_WAIT_S.get(), 0.0)
        self.prefill_time_s.labels(*self._labels).observe(prefill_s)

    def _finished(self, status: str, seen: _Seen) -> None:
        self.itl_s.add(seen.gaps)
        finish = FINISH_REASONS.get(seen.finish, "")
        self.requests.labels(*self._labels, status, finish).inc()
        self.prompt_tokens.labels(*self._labels).inc(seen.num_prompt_tokens)
        self.generation_tokens.labels(*self._labels).inc(seen.num_output_tokens)
        if seen.finish:
            self.prompt_tokens_per_request.labels(*self._labels).observe(seen.num_prompt_tokens)
            n = seen.num_output_tokens
            self.generation_tokens_per_request.labels(*self._labels).observe(n)
        if status == "ok":
            self.e2e_s.labels(*self._labels).observe(time.perf_counter() - seen.started_s)
            if seen.first_token_s is not None:
                decode_s = seen.last_token_s - seen.first_token_s
                self.decode_time_s.labels(*self._labels).observe(decode_s)


class _QueueWaits:
    """The queue's wait times (admission.WaitTimes): to the histogram, and kept for the request
    whose task observed it (`_QUEUE_WAIT_S`)."""

    def __init__(self, histogram) -> None:
        self._histogram = histogram

    def observe(self, amount: float) -> None:
        self._histogram.observe(amount)
        _QUEUE_WAIT_S.set(amount)


class _Seen:
    """What one request's responses have shown so far, and its gaps between tokens not yet in
    the histogram."""

    def __init__(self, gaps: GapBatch) -> None:
        self.gaps = gaps
        self.started_s = time.perf_counter()
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish = inference_pb2.FINISH_REASON_UNSPECIFIED
        self.num_prompt_tokens = 0
        self._num_output_tokens: dict[int, int] = {}  # by choice (GenerateRequest.n)

    @property
    def num_output_tokens(self) -> int:
        """Every choice's generated tokens (one prompt, as OpenAI counts n choices)."""
        return sum(self._num_output_tokens.values())

    def add(self, response: inference_pb2.GenerateResponse) -> bool:
        """Take `response` in; True when it brought the first token."""
        first = False
        num_tokens = len(response.token_ids)
        if num_tokens:
            now_s = time.perf_counter()
            if self.last_token_s is None:
                self.first_token_s = now_s
                first = True
            else:  # each of its tokens came (now - last) / n after the one before
                self.gaps.observe((now_s - self.last_token_s) / num_tokens, num_tokens)
            self.last_token_s = now_s
        so_far = self._num_output_tokens.get(response.index, 0)
        self._num_output_tokens[response.index] = max(so_far, response.num_output_tokens)
        if response.finish_reason:
            self.finish = response.finish_reason
            self.num_prompt_tokens = response.num_prompt_tokens
        return first


class MeteredRouter:
    """`Router.agenerate`, measured: what the front ends (gRPC Inference, HTTP) route through."""

    def __init__(self, router: Router, metrics: RequestMetrics) -> None:
        self._router = router
        self._metrics = metrics

    def agenerate(
        self, request: inference_pb2.GenerateRequest, context
    ) -> AsyncGenerator[inference_pb2.GenerateResponse, None]:
        """`Router.agenerate`, measured: its responses pass through `aobserve` (NOTE: returned,
        not re-yielded here: each async generator in the chain costs every token a hop)."""
        return self._metrics.aobserve(self._router.agenerate(request, context), context)
