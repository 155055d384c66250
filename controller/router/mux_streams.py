"""One request's end of a worker's multiplexed call (`worker_mux.py`): the stream its caller
reads, by one thread (`MuxStream`) or on an event loop (`AsyncMuxStream`), the `StreamFailed` it
raises, and the hand-over of a message's events to their streams.

The worker sends one message per engine step with every request's news; the mux's reader hands
each event to its request's queue, where the thread serving that client takes it. In async
mode (the gRPC front end, whose handlers run on one event loop) a message's items for another
loop go to it in one `call_soon_threadsafe`, however many of its requests it carries: a thread
wake-up per engine step, not per token.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc
from intentserve.common.field_errors import FieldViolation
from intentserve.common.streaming import END, HandOver
from intentserve.controller.router.coalesce import append, joins
from intentserve.v1 import inference_pb2

if TYPE_CHECKING:
    from intentserve.controller.router.worker_mux import WorkerMux

log = logging.getLogger(__name__)


class StreamFailed(grpc.RpcError):
    """One request's end on the multiplexed call, read as its own call's error would be."""

    def __init__(
        self, code: grpc.StatusCode, details: str, field_violation: FieldViolation | None = None
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.field_violation = field_violation  # a refused field, from the worker's detail

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class MuxStream(HandOver):
    """One request on a worker's multiplexed call; iterate it for its responses (a
    GenerateResponse each; a failure is raised as StreamFailed)."""

    def __init__(self, mux: WorkerMux, key: int) -> None:
        super().__init__()
        self._mux = mux
        self.key = key

    def cancel(self) -> None:
        """Abort the request on the worker and end this stream with CANCELLED now (a no-op once
        it has ended)."""
        if self._mux.cancel(self.key):
            self._items.put(StreamFailed(grpc.StatusCode.CANCELLED, "cancelled by the caller"))

    def _put(self, item: object) -> None:
        self._items.put(item)


class AsyncMuxStream:
    """One request on a worker's multiplexed call, read on an event loop: `async for` its
    responses (a failure is raised as StreamFailed). Items reach it on `loop` only. A choice's
    chunks that wait together are read as one response (`coalesce`).

    NOTE: a deque and the reader's one future while it waits, not an asyncio.Queue: an item
    costs an append, and a wake-up only when the reader is waiting for it."""

    def __init__(self, mux: WorkerMux, key: int, loop: asyncio.AbstractEventLoop) -> None:
        self._mux = mux
        self.key = key
        self.loop = loop
        self._items: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._done = False

    def __aiter__(self) -> AsyncMuxStream:
        return self

    async def __anext__(self) -> inference_pb2.GenerateResponse:
        if self._done:
            raise StopAsyncIteration
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if item is END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        while items and joins(item, items[0]):  # the reader fell behind: one message for all
            append(item, items.popleft())
        return item

    def cancel(self) -> None:
        """As MuxStream.cancel; callable from any thread (a lost worker's streams are ended by
        the reconcile loop)."""
        if self._mux.cancel(self.key):
            failure = StreamFailed(grpc.StatusCode.CANCELLED, "cancelled by the caller")
            self.loop.call_soon_threadsafe(self._put, failure)

    def _put(self, item: object) -> None:
        """On the loop's thread only."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


Stream = MuxStream | AsyncMuxStream


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def hand_over(deliveries: Iterable[tuple[Stream, object]]) -> None:
    """Give each item to its stream: a sync stream, or an async one on the loop this runs on,
    at once; those of another loop in one call onto it (NOTE: a thread wake-up of that loop per
    message, not per event)."""
    here = running_loop()
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Stream, object]]] = defaultdict(list)
    for stream, item in deliveries:
        if isinstance(stream, AsyncMuxStream) and stream.loop is not here:
            by_loop[stream.loop].append((stream, item))
        else:
            stream._put(item)
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the loop has closed: the server stopped, nobody reads
            log.debug("dropped %d items for a closed event loop", len(batch))


def _put_all(batch: list[tuple[Stream, object]]) -> None:
    for stream, item in batch:
        stream._put(item)
