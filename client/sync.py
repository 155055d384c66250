"""The blocking client of a controller or a router: the asyncio client, run on one event loop in
a thread of its own, so both clients make the same calls and fail the same way (`ClientError`).

Every stream of one client goes on one call (`Inference.GenerateMany`), from any number of
threads; measured on the 2-core AMD EPYC, 64 streams of a served bf16 model (README, Python
clients): the blocking client's process 39-43 us of CPU per token (a thread per stream, woken
per token) where a call per stream had cost 78-87, the asyncio client's 24-27.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import grpc
from intentserve.client.aio import DEFAULT_CONTROLLER, AsyncControllerClient
from intentserve.client.calls import DEADLINE_GRACE_S, ClientError, chunk_of
from intentserve.client.credentials import Credentials
from intentserve.client.requests import check_timeout, generate_request


class ControllerClient:
    def __init__(
        self,
        address: str = DEFAULT_CONTROLLER,
        timeout_s: float = 10.0,
        credentials: Credentials | None = None,
    ) -> None:
        """`credentials` default to what `up` wrote for `address` (and the environment)."""
        self.address = address
        self.timeout_s = timeout_s
        self._aio = AsyncControllerClient(address, timeout_s, credentials)
        self._loop: LoopThread | None = None  # made at the first call
        self._lock = threading.Lock()
        self._closed = False

    def status(self) -> dict[str, Any]:
        return self._run(self._aio.status)

    def explain(self, worker_id: str) -> dict[str, Any]:
        return self._run(lambda: self._aio.explain(worker_id))

    def drain(self, worker_id: str, *, force: bool = False) -> dict[str, Any]:
        return self._run(lambda: self._aio.drain(worker_id, force=force))

    def resume(self, worker_id: str) -> dict[str, Any]:
        return self._run(lambda: self._aio.resume(worker_id))

    def shutdown(self) -> None:
        self._run(self._aio.shutdown)

    def health(self, service: str = "") -> str:
        """ "serving", "not_serving", ... as `grpc.health.v1` reports it."""
        return self._run(lambda: self._aio.health(service))

    def generate(
        self,
        prompt: str,
        *,
        chat: bool = False,
        max_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        n: int = 1,
        timeout_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream the chunks of one generation (`text`, `token_ids`, ..., `finish_reason` last);
        with `n` > 1, of n choices forked from the prompt, each chunk naming its `index` and each
        choice ending with its own `finish_reason`. Safe from many threads at once: their
        streams share the client's one call. An error is a `grpc.RpcError` (`ClientError`) with
        the code and details the request's own `Generate` call would have ended with. Leaving
        the loop early (or closing the iterator) cancels the request on its worker; the
        controller holds the request to `timeout_s`."""
        check_timeout(timeout_s)
        request = generate_request(
            prompt,
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop,
            ignore_eos=ignore_eos,
            n=n,
        )
        events: queue.SimpleQueue = queue.SimpleQueue()
        loop = self._loop_thread()
        shared, key = loop.call(self._aio.start, request, timeout_s, events)
        num_running = request.n or 1  # 0 on the wire is 1
        # NOTE: the controller ends the request at timeout_s and says DEADLINE_EXCEEDED itself
        # (and counts it so); the wait here is longer by a grace, only so that a controller
        # that stops answering cannot hold the caller.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s + DEADLINE_GRACE_S
        ended = False
        try:
            while not ended:
                try:
                    event = events.get(
                        timeout=None if deadline is None else max(0.0, deadline - time.monotonic())
                    )
                except queue.Empty:
                    raise ClientError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no answer from the controller within timeout_s ({timeout_s} s) "
                        f"+ {DEADLINE_GRACE_S} s",
                    ) from None
                ended = True  # unless it reads as a chunk that does not finish the request
                chunk, finished = chunk_of(event)
                num_running -= finished
                ended = not num_running
                yield chunk
        finally:
            if not ended:
                loop.soon(shared.cancel, key)

    def _run(self, call: Callable[[], Coroutine]) -> Any:
        """`call()`'s coroutine on the client's loop; its result, or its ClientError, here."""
        return self._loop_thread().run(call)

    def _loop_thread(self) -> LoopThread:
        with self._lock:
            if self._closed:
                raise ValueError("the client is closed")
            if self._loop is None:
                self._loop = LoopThread()
            return self._loop

    def close(self) -> None:
        """End the streams' call (what still runs on it ends CANCELLED) and the channel."""
        with self._lock:
            loop, self._loop, self._closed = self._loop, None, True
        if loop is not None:
            with contextlib.suppress(Exception):  # closing: what is left ends with the loop
                loop.run(self._aio.close, timeout_s=10)
            loop.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class LoopThread:
    """An event loop running in a daemon thread of its own, for the blocking client."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="intentserve-client-loop", daemon=True
        )
        self._thread.start()

    def call(self, fn, *args):
        """fn(*args) on the loop; its result (or its exception) here. ValueError when the loop
        has stopped (the client was closed) before it ran."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn(*args))
                except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                    done.set_exception(error)

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed
            raise ValueError("the client is closed") from None
        while True:
            try:
                return done.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():
                    done.cancel()
                    raise ValueError("the client is closed") from None

    def run(self, call: Callable[[], Coroutine], timeout_s: float | None = None):
        """`call()`'s coroutine on the loop (made there, so none is left unawaited when the loop
        has stopped); its result here."""

        async def run() -> Any:
            return await call()

        try:
            future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        except RuntimeError:  # the loop is closed
            raise ValueError("the client is closed") from None
        return future.result(timeout_s)

    def soon(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed, and the call with it
            self._loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
