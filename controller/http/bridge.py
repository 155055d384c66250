"""An HTTP request on the router: the router is synchronous (it blocks on its gRPC call to the
worker), the HTTP server is asyncio. Each request gets a thread that runs the router, as a gRPC
stream does, and hands the responses over to the event loop one by one.

    call = HttpCall()                     # what the router reads of a grpc.ServicerContext
    responses = RoutedResponses(router, request, call, executor)
    async for response in responses: ...  # the router's error, if any, is raised here
    call.cancel()                         # the client went away: the worker aborts, KV is freed
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor

from intentserve.v1 import inference_pb2

_END = object()


class HttpCall:
    """The router's view of one HTTP request: never a deadline (the client sets none over
    HTTP), active until `cancel()`, which runs every callback the router added (it cancels the
    upstream call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []
        self._cancelled = False

    def time_remaining(self) -> float | None:
        return None

    def add_callback(self, callback: Callable[[], object]) -> bool:
        """False when already cancelled (the caller then cancels at once), as grpc's does."""
        with self._lock:
            if self._cancelled:
                return False
            self._callbacks.append(callback)
            return True

    def is_active(self) -> bool:
        return not self._cancelled

    def cancel(self) -> None:
        """Idempotent; after the last response it changes nothing upstream."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class RoutedResponses:
    """`router.generate(request, call)` run on an executor thread; iterate it on the loop."""

    def __init__(
        self, router, request: inference_pb2.GenerateRequest, call: HttpCall, executor: Executor
    ) -> None:
        self._router = router
        self._request = request
        self._call = call
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        executor.submit(self._pump)

    def _pump(self) -> None:
        try:
            for response in self._router.generate(self._request, self._call):
                self._put(response)
        except Exception as error:  # the router's refusal, for the loop to raise
            self._put(_Failure(error))
        finally:
            self._put(_END)

    def _put(self, item: object) -> None:
        # NOTE: the loop may be gone (the server stopped): there is no one left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> RoutedResponses:
        return self

    async def __anext__(self) -> inference_pb2.GenerateResponse:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # it stays ended
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            raise item.error
        return item
