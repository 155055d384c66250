"""Inference routing: pick the READY worker with the fewest outstanding requests that has a free
slot (as many as the sequence slots it realized, or `max_outstanding_per_worker` when the
operator set it), and forward `Generate` on that worker's multiplexed call with the client's
remaining deadline and cancellation. While every slot is taken, a request waits in the
admission queue (admission.py), in arrival order, until one frees. A worker that refuses a
request as full (its own admission, which counts every router's requests) is skipped for a
moment and the request waits at the head of the queue again (full_workers.py); a worker that
refuses otherwise before streaming (unreachable) sends it to the next one. The request's content is
checked once, by the worker's engine; its INVALID_ARGUMENT (naming the field) passes through.
A call the worker ends with UNAVAILABLE (its process died, its connection broke, its engine
stopped) makes that worker SUSPECT at once; a client's own cancel or deadline never does.

A request of n choices (`GenerateRequest.n`) goes to one worker whole and takes n of its slots
(all of them when n is more: the worker, whose own slots are the authority, then serves or
refuses it); a retry before the first response retries every choice.

Both front ends route on an event loop with `agenerate` (the gRPC server's, uvicorn's for the
HTTP API): a client's cancel or deadline arrives as `asyncio.CancelledError` in the handler and
the worker's request is cancelled on the way out.

The router is a proxy: the request and response messages pass through unchanged (save the ids
it fills in), so it handles `inference_pb2` messages directly and nothing else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

import grpc
from intentserve.common.ids import new_request_id
from intentserve.controller.errors import NotReady, Overloaded
from intentserve.controller.router.admission import (
    DEFAULT_QUEUE_LIMITS,
    AdmissionQueue,
    QueueLimits,
    WaitTimes,
)
from intentserve.controller.router.channels import WorkerChannels
from intentserve.controller.router.full_workers import FullWorkers
from intentserve.controller.router.mux_streams import Stream
from intentserve.controller.router.request_size import check_request
from intentserve.controller.router.table import (
    GENERATE,
    Route,
    WorkerTable,
    longest_served,
    refuse_other_task,
)
from intentserve.controller.router.upstream import NO_READY_WORKER, TryAnother, upstream_failure
from intentserve.policy import Reason, ReasonCode
from intentserve.v1 import inference_pb2

log = logging.getLogger(__name__)

# NOTE: grpc reports "no deadline" as a remaining time of about 2**63 seconds.
_NO_DEADLINE_S = 1e9


class _Stream:
    """One forwarded call, so that a lost worker's streams can be ended from the outside."""

    def __init__(self) -> None:
        self.call: Stream | None = None
        self.abort_reason: Reason | None = None


class Router:
    def __init__(
        self,
        table: WorkerTable,
        *,
        max_outstanding_per_worker: int | None = None,
        queue_limits: QueueLimits = DEFAULT_QUEUE_LIMITS,
        queue_wait_times: WaitTimes,
        channel_factory: Callable[[str, str], grpc.Channel] = lambda address, worker_id: (
            grpc.insecure_channel(address)
        ),
        aio_channel_factory: Callable[[str, str], grpc.aio.Channel] | None = None,
    ) -> None:
        """`table`: the verified workers and the deployment's readiness (table.py).
        `aio_channel_factory`: channels for the multiplexed calls of requests served on an
        event loop, made on that loop (worker_mux.py); None: those use `channel_factory`'s too,
        read by a thread. `max_outstanding_per_worker`: requests sent to each worker at once;
        None: its realized sequence slots."""
        self._table = table
        self._max_per_worker = max_outstanding_per_worker
        self.queue: AdmissionQueue[tuple[Route, int]] = AdmissionQueue(
            queue_limits, num_slots=self._num_slots, wait_times=queue_wait_times
        )
        self.channels = WorkerChannels(table, channel_factory, aio_channel_factory)
        self._full = FullWorkers()
        self._lock = threading.Lock()
        self._streams: dict[str, set[_Stream]] = {}
        self._turn = itertools.count()  # breaks ties between equally loaded workers

    async def agenerate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Admit the request, pick a worker (the next one when a worker refuses before
        streaming), and pass its responses through; `context` is the front end's call
        (`time_remaining`, `cancelled`)."""
        self._admit(request)
        tried: dict[str, Exception] = {}
        arrived_s, again_since_s = time.monotonic(), None
        while True:
            route, num_slots = await self.queue.take(
                lambda: self._acquire(tried, request.n or 1),
                _timeout_s(context),
                again_since_s=again_since_s,
            )
            full = False
            try:
                forwarded = self._aforward(route, request, context)
                async with contextlib.aclosing(forwarded) as responses:
                    async for response in responses:
                        yield response
                return
            except TryAnother as refusal:
                full = isinstance(refusal.failure, Overloaded)
                if full:  # it waits at the head of the queue, as since it came
                    again_since_s = arrived_s
                    call_after(self._full.mark(route.worker_id), self.queue.wake)
                else:
                    tried[route.worker_id] = refusal.failure
            finally:
                if not full:
                    self._full.clear(route.worker_id)  # a slot of it freed, if it took one
                self._table.release(route.worker_id, num_slots)
                self.queue.wake()

    def abort_streams(self, worker_id: str, reason: Reason) -> int:
        """End every stream to a worker (it was lost); each ends with UNAVAILABLE."""
        with self._lock:
            streams = list(self._streams.get(worker_id, ()))
        for stream in streams:
            stream.abort_reason = reason
            if stream.call is not None:
                stream.call.cancel()
        return len(streams)

    def close(self) -> None:
        self.channels.close()

    def workers_changed(self) -> None:
        """A worker's state changed (more slots may be free, or none left to wait for): the
        head of the queue tries again."""
        self.queue.wake()

    def _admit(self, request: inference_pb2.GenerateRequest) -> None:
        """Give the request an id; refuse it unless the deployment is ready, or when it is over a
        size it may have (request_size.py)."""
        if not request.request_id:
            request.request_id = new_request_id()
        check_request(request, longest_served(self._routes()))
        readiness = self._table.readiness()
        if not readiness.ready:
            raise NotReady(readiness.reason)
        refuse_other_task(self._table.routes(), GENERATE)

    def _routes(self) -> tuple[Route, ...]:
        """The READY workers that generate (an encoder's serve Embed only)."""
        return tuple(r for r in self._table.routes() if r.task == GENERATE)

    def _limit(self, route: Route) -> int:
        """Requests a READY worker is sent at once: the operator's number, else its slots."""
        if self._max_per_worker is not None:
            return self._max_per_worker
        return route.max_num_seqs

    def _num_slots(self) -> int:
        """The slots of the READY workers (what the queue's default bound is a multiple of)."""
        return sum(self._limit(r) for r in self._routes())

    def _acquire(self, tried: dict[str, Exception], n: int) -> tuple[Route, int] | None:
        """The READY worker with the fewest outstanding requests that has room for a request of
        `n` choices, and the slots it took there (n, or all when n is more); None when every
        READY worker not yet tried is full, by this router's count or its own refusal (the
        request waits)."""
        ready = [r for r in self._routes() if r.worker_id not in tried]
        if ready:  # rotate, so that equally loaded workers take turns (the sort is stable)
            shift = next(self._turn) % len(ready)
            ready = ready[shift:] + ready[:shift]
        for route in sorted(ready, key=lambda r: r.num_outstanding):
            if self._full.is_full(route.worker_id):
                continue
            limit = self._limit(route)
            if self._table.try_acquire(route.worker_id, limit, min(n, limit)):
                return route, min(n, limit)
        if ready:
            return None
        if tried:
            raise list(tried.values())[-1]  # what the last worker tried said
        readiness = self._table.readiness()
        reason = readiness.reason if not readiness.ready else NO_READY_WORKER
        raise NotReady(reason)

    async def _aforward(
        self,
        route: Route,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """One worker's responses, on its multiplexed call (a step's tokens for all its requests
        in one message; the worker enforces the deadline too). The client's cancel or deadline
        cancels the handler's task (asyncio.CancelledError, here while awaiting the next item or
        the write of one), and the `finally` sends the worker the cancel."""
        timeout_s = _timeout_s(context)
        stream = _Stream()
        self._track(route.worker_id, stream, add=True)
        started = False
        try:
            loop = asyncio.get_running_loop()
            mux = self.channels.mux(route.address, route.worker_id, loop=loop)
            stream.call = call = mux.open(request, timeout_s, loop=loop)
            if stream.abort_reason is not None:  # an abort asked before the call existed
                call.cancel()
            async for response in call:
                started = True
                if not response.worker_id:
                    response.worker_id = route.worker_id
                yield response
        except grpc.RpcError as error:
            if stream.abort_reason is None and _client_gone(context):
                return  # the client cancelled or its deadline passed: nobody to tell
            if stream.abort_reason is None and error.code() is grpc.StatusCode.UNAVAILABLE:
                self._suspect(route, error, started)
            raise upstream_failure(route.worker_id, error, started, stream.abort_reason) from None
        finally:
            if stream.call is not None:
                stream.call.cancel()  # a no-op once it ended; else the client went away
            self._track(route.worker_id, stream, add=False)

    def _suspect(self, route: Route, error: grpc.RpcError, started: bool) -> None:
        where = "mid-stream" if started else "before streaming"
        reason = Reason(
            ReasonCode.WORKER_NOT_SERVING, f"suspect: a stream broke {where}: {error.details()}"
        )
        if self._table.suspect(route.worker_id, route.address, reason):
            log.warning("worker %s is suspect: %s", route.worker_id, reason.message)

    def _track(self, worker_id: str, stream: _Stream, *, add: bool) -> None:
        with self._lock:
            streams = self._streams.setdefault(worker_id, set())
            if add:
                streams.add(stream)
            else:
                streams.discard(stream)


def call_after(delay_s: float, callback: Callable[[], None]) -> None:
    """Call `callback` on the running loop once `delay_s` seconds of `time.monotonic()` (the
    clock FullWorkers reads) have passed. NOTE: a loop's timer may fire early by that clock:
    uvloop reads its own clock once per loop iteration, so a timer set late in a busy one is due
    early, and a full worker retried then is still skipped, with no wake left to come."""
    due_s = time.monotonic() + delay_s
    loop = asyncio.get_running_loop()

    def fire() -> None:
        left_s = due_s - time.monotonic()
        if left_s > 0:
            loop.call_later(left_s, fire)
        else:
            callback()

    loop.call_later(delay_s, fire)


def _timeout_s(context: grpc.aio.ServicerContext) -> float | None:
    """The client's remaining deadline, to forward; None when it set none."""
    remaining_s = context.time_remaining()
    return None if remaining_s is None or remaining_s > _NO_DEADLINE_S else remaining_s


def deadline_passed(context) -> bool:
    """Whether the call's deadline has ended it (`context`: what the router reads of a call,
    here `code()` and `time_remaining()`). A front end that enforces the deadline itself (a
    GenerateMany request, client_mux.py) says so by the call's code, DEADLINE_EXCEEDED once its
    timer fired: a fact, where its loop's clock and any other may disagree by a hair (uvloop's
    timers fire by a clock read once per iteration). NOTE: a gRPC call's deadline is enforced
    by grpc's core, which tells the handler only that the call ended (cancelled, its code
    unset, as for a client's cancel); there the time left is what tells them apart: the core
    ends the call at the deadline `time_remaining()` reads (against the wall clock, not the
    event loop's), and its news reaches the handler after that."""
    if context.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    remaining_s = context.time_remaining()
    return remaining_s is not None and remaining_s <= 0


def _client_gone(context: grpc.aio.ServicerContext) -> bool:
    """Whether the client cancelled or its deadline passed (the worker, which holds the same
    deadline, may report it before the task is cancelled)."""
    return context.cancelled() or deadline_passed(context)
