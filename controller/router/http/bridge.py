"""An HTTP request on the router, on the HTTP server's event loop: `router.agenerate` runs in a
task of that loop (the worker's multiplexed call is read there too, worker_mux.py), as a gRPC
stream's handler runs on the gRPC server's loop. No thread is woken per response.

    call = HttpCall()                     # what the router reads of a grpc.aio.ServicerContext
    responses = RoutedResponses(router, request, call)
    async for response in responses: ...  # the router's error, if any, is raised here
    call.cancel()                         # the client went away: the worker aborts, KV is freed
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from intentserve.v1 import inference_pb2

_END = object()


class HttpCall:
    """The router's view of one HTTP request (what it reads of a grpc.aio.ServicerContext):
    never a deadline (the client sets none over HTTP), cancelled once `cancel()` ran, which runs
    every callback added (RoutedResponses': it cancels the routing task, whose `finally` cancels
    the upstream call). Used on the HTTP server's loop only."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], object]] = []
        self._cancelled = False

    def time_remaining(self) -> float | None:
        return None

    def code(self) -> None:
        """None: no deadline ends an HTTP request here (as grpc's while no code is set)."""
        return None

    def add_callback(self, callback: Callable[[], object]) -> bool:
        """False when already cancelled (the caller then cancels at once), as grpc's does."""
        if self._cancelled:
            return False
        self._callbacks.append(callback)
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Idempotent; after the last response it changes nothing upstream."""
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
    """`router.agenerate(request, call)` run in a task of the running loop; iterate it there.
    The task runs ahead of the reader by whatever the worker sends (a queue between them), and
    `call.cancel()` cancels it."""

    def __init__(self, router, request: inference_pb2.GenerateRequest, call: HttpCall) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._pump(router, request, call))
        if not call.add_callback(self._task.cancel):
            self._task.cancel()  # cancelled already: the router never starts

    async def _pump(self, router, request: inference_pb2.GenerateRequest, call: HttpCall) -> None:
        try:
            async with contextlib.aclosing(router.agenerate(request, call)) as responses:
                async for response in responses:
                    self._queue.put_nowait(response)
        except Exception as error:  # the router's refusal, for the reader to raise
            self._queue.put_nowait(_Failure(error))
        finally:
            self._queue.put_nowait(_END)

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
