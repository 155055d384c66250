"""An event loop in a thread of its own, and health published onto it: what the controller's
and a router's grpc.aio servers run on (their own APIs stay synchronous). Which loop (uvloop or
asyncio's) is event_loop.py's choice."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import Any, TypeVar

from grpc_health.v1 import _async as async_health
from grpc_health.v1 import health
from intentserve.controller.event_loop import EventLoopChoice

log = logging.getLogger(__name__)

T = TypeVar("T")


class EventLoopThread:
    """An event loop (the kind `choice` names) running in a daemon thread of its own; other
    threads hand it coroutines and wait for their results."""

    def __init__(self, name: str, choice: EventLoopChoice) -> None:
        self.loop = choice.new_loop()
        self.choice = choice
        log.info("%s runs on %s", name, choice.why)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.closed = False

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and return its result (or raise its error)."""
        return self.future(coroutine).result()

    def future(self, coroutine: Coroutine[Any, Any, T]) -> futures.Future[T]:
        """Run `coroutine` on the loop; its result is waited for later."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def submit(self, coroutine: Coroutine[Any, Any, Any], what: str) -> None:
        """Run `coroutine` on the loop without waiting; a failure is logged."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        future.add_done_callback(lambda done: _log_failure(done, what))

    def close(self) -> None:
        """Finish the loop's async generators, stop it and join its thread."""
        if self.closed:
            return
        self.closed = True
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _log_failure(done: futures.Future, what: str) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("%s failed", what, exc_info=done.exception())


class HealthPublisher:
    """What the reconciler publishes health to, from its own thread: the aio server's servicer
    (set on its loop) and, when there is a probe port, that sync server's servicer alike.

    NOTE: grpc_health's sync servicer cannot serve an aio server (its Watch needs
    `context.add_callback`, which aio contexts lack); the async one's setters are coroutines.
    They are submitted in order, and run in order on the loop."""

    def __init__(
        self,
        loop: EventLoopThread,
        servicer: async_health.HealthServicer,
        probe: health.HealthServicer | None,
    ) -> None:
        self._loop = loop
        self.servicer = servicer
        self._probe = probe

    def set(self, service: str, status: int) -> None:
        if self._probe is not None:
            self._probe.set(service, status)
        self._loop.submit(self.servicer.set(service, status), f"health of {service!r}")

    def enter_graceful_shutdown(self) -> None:
        if self._probe is not None:
            self._probe.enter_graceful_shutdown()
        self._loop.submit(self.servicer.enter_graceful_shutdown(), "health's shutdown")
