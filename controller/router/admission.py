"""The admission queue: a request waits here, in arrival order, until a READY worker has a free
slot (as many as the sequence slots it realized), its deadline passes, or its client goes away.

    queue = AdmissionQueue(QueueLimits(), num_slots=..., wait_times=histogram)
    slot = await queue.take(try_take, deadline_s)  # try_take(): a slot, None (none free), or raises
    ...
    queue.wake()                                    # a slot freed, or the workers changed

Only the head of the queue tries for a slot, and a newcomer takes one at once only when nobody
waits: nobody is overtaken. Both front ends share the queue from their own event loops, so a
waiter is woken on its loop (`call_soon_threadsafe`) by whichever thread freed the slot. A
waiter holds nothing while it waits: a client that goes away cancels its task and it just
leaves, and no slot is ever taken for a request that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from intentserve.controller.errors import QueueFull, QueueTimeout

T = TypeVar("T")

# Without `maxQueued`, the queue holds this many requests per sequence slot of the READY workers.
QUEUED_PER_SLOT = 4
DEFAULT_MAX_QUEUE_WAIT_S = 300.0
# NOTE: a wait ends this long before the request's deadline, so that the status naming the wait
# reaches the client before the client's own timer ends the call with a bare "Deadline Exceeded"
# (a request that would reach its worker with less left could not be served anyway).
DEADLINE_MARGIN_S = 0.05
MAX_QUEUED = "max_queued (spec.controller.admission.maxQueued)"
MAX_QUEUE_WAIT = "max_queue_wait_s (spec.controller.admission.maxQueueWaitS)"


@dataclass(frozen=True)
class QueueLimits:
    max_queued: int | None = None  # None: QUEUED_PER_SLOT x the READY workers' slots
    max_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S


DEFAULT_QUEUE_LIMITS = QueueLimits()


class WaitTimes(Protocol):
    """Where each request's time in the queue goes (a Prometheus histogram)."""

    def observe(self, amount: float) -> None: ...


class _Waiter:
    def __init__(self, try_take: Callable[[], object]) -> None:
        self.try_take = try_take
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()  # set on `loop`: its turn to try

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits there now
            self.loop.call_soon_threadsafe(self.event.set)


class AdmissionQueue(Generic[T]):
    def __init__(
        self, limits: QueueLimits, *, num_slots: Callable[[], int], wait_times: WaitTimes
    ) -> None:
        """`num_slots()`: the sequence slots of the READY workers (the default bound's base)."""
        self.limits = limits
        self._num_slots = num_slots
        self._wait_times = wait_times
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    async def take(
        self,
        try_take: Callable[[], T | None],
        deadline_s: float | None,
        *,
        again_since_s: float | None = None,
    ) -> T:
        """A slot: at once when one is free and nobody waits, else after waiting in line.
        QueueFull when the queue holds its most; QueueTimeout when `deadline_s` (the request's
        remaining time, less DEADLINE_MARGIN_S; None: none) or the longest wait passes first;
        whatever `try_take` raises (e.g. the deployment stopped being ready) ends the wait too.
        `again_since_s`: the request had its turn and the worker refused it as full; it came
        at this time (`time.monotonic()`): it waits at the head of the line (it overtakes
        nobody, and no bound refuses it), and its longest wait counts from then."""
        with self._lock:
            if not self._waiters and (slot := try_take()) is not None:
                self._wait_times.observe(0.0)
                return slot
            waiter = self._enqueue(try_take, again=again_since_s is not None)
        started_s = time.monotonic()
        try:
            return await self._wait(waiter, deadline_s, again_since_s or started_s)
        finally:
            self._leave(waiter)
            self._wait_times.observe(time.monotonic() - started_s)

    def wake(self) -> None:
        """A slot may be free: the head of the queue tries again (from any thread)."""
        with self._lock:
            if self._waiters:
                self._waiters[0].wake()

    def _enqueue(self, try_take: Callable[[], T | None], *, again: bool) -> _Waiter:
        if again:
            waiter = _Waiter(try_take)
            self._waiters.appendleft(waiter)
            return waiter
        num_waiting = len(self._waiters)
        if self.limits.max_queued is not None:
            limit = self.limits.max_queued
            how = f"{MAX_QUEUED}: {limit}"
        else:
            num_slots = self._num_slots()
            limit = QUEUED_PER_SLOT * num_slots
            how = (
                f"{QUEUED_PER_SLOT} x the {num_slots} sequence slots of the READY workers; "
                f"{MAX_QUEUED} sets it"
            )
        if num_waiting >= limit:
            raise QueueFull(
                f"every worker slot is taken and the admission queue is full: {num_waiting} "
                f"requests wait ({how})"
            )
        waiter = _Waiter(try_take)
        self._waiters.append(waiter)
        return waiter

    async def _wait(self, waiter: _Waiter, deadline_s: float | None, started_s: float) -> T:
        max_wait_s = self.limits.max_wait_s
        left_s = max(max_wait_s - (time.monotonic() - started_s), 0.0)
        if deadline_s is None or deadline_s > left_s + DEADLINE_MARGIN_S:
            wait_s, by_deadline = left_s, False
        else:
            wait_s, by_deadline = max(deadline_s - DEADLINE_MARGIN_S, 0.0), True
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    await waiter.event.wait()
                    waiter.event.clear()  # NOTE: before trying, so a wake during it is kept
                    with self._lock:
                        slot = waiter.try_take() if self._waiters[0] is waiter else None
                    if slot is not None:
                        return slot
        except TimeoutError:
            waited_s = time.monotonic() - started_s
            if by_deadline:
                raise QueueTimeout(
                    f"deadline exceeded after {waited_s:.2f} s in the admission queue, waiting "
                    "for a worker slot"
                ) from None
            raise QueueTimeout(
                f"waited {waited_s:.2f} s in the admission queue for a worker slot, the longest "
                f"a request waits ({MAX_QUEUE_WAIT}: {max_wait_s:g} s)"
            ) from None

    def _leave(self, waiter: _Waiter) -> None:
        """Out of the line (served, expired, refused or gone); a new head tries at once."""
        with self._lock:
            was_head = bool(self._waiters) and self._waiters[0] is waiter
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            if was_head and self._waiters:
                self._waiters[0].wake()
