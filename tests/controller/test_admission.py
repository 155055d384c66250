"""The admission queue on its own: requests wait for a slot in arrival order, a bounded number of
them, each until its deadline; a cancelled one leaves at once; a freed slot wakes the next."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from intentserve.controller.errors import NotReady, QueueFull, QueueTimeout
from intentserve.controller.router.admission import (
    DEADLINE_MARGIN_S,
    AdmissionQueue,
    QueueLimits,
)
from intentserve.policy import Reason, ReasonCode


class Slots:
    """A pool of `num_slots` slots; `give` frees one and wakes the queue, as the router does."""

    def __init__(self, num_slots: int) -> None:
        self.num_free = num_slots
        self.queue: AdmissionQueue | None = None
        self.error: Exception | None = None  # raised by every try while set

    def try_take(self) -> str | None:
        if self.error is not None:
            raise self.error
        if self.num_free == 0:
            return None
        self.num_free -= 1
        return "slot"

    def give(self) -> None:
        self.num_free += 1
        self.queue.wake()


class Waits:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def observe(self, seconds: float) -> None:
        self.seconds.append(seconds)


def make(num_slots: int, *, max_queued: int | None = 16, max_wait_s: float = 30.0):
    slots = Slots(num_slots)
    waits = Waits()
    slots.queue = AdmissionQueue(
        QueueLimits(max_queued, max_wait_s), num_slots=lambda: num_slots, wait_times=waits
    )
    return slots.queue, slots, waits


async def enqueue(queue: AdmissionQueue, slots: Slots, deadline_s: float | None = None):
    """A task taking a slot, once it waits in the queue."""
    before = queue.num_waiting
    task = asyncio.create_task(queue.take(slots.try_take, deadline_s))
    while queue.num_waiting == before and not task.done():
        await asyncio.sleep(0)
    return task


def test_a_free_slot_is_taken_at_once_without_waiting():
    async def main():
        queue, slots, waits = make(1)
        assert await queue.take(slots.try_take, None) == "slot"
        assert (queue.num_waiting, waits.seconds) == (0, [0.0])

    asyncio.run(main())


def test_waiters_are_served_in_arrival_order_as_slots_free():
    async def main():
        queue, slots, waits = make(0)
        served: list[int] = []
        tasks = []
        for i in range(5):
            task = await enqueue(queue, slots)
            task.add_done_callback(lambda _, i=i: served.append(i))
            tasks.append(task)
        assert queue.num_waiting == 5
        for n in range(1, 6):
            slots.give()
            await asyncio.wait_for(tasks[n - 1], 1)
            await asyncio.sleep(0.01)  # a second waiter, wrongly woken, would finish here
            assert served == list(range(n))
        assert queue.num_waiting == 0
        assert len(waits.seconds) == 5 and all(s > 0 for s in waits.seconds)

    asyncio.run(main())


def test_a_newcomer_never_overtakes_a_waiter_for_a_freed_slot():
    async def main():
        queue, slots, _ = make(0)
        first = await enqueue(queue, slots)
        slots.give()  # free, and the first is woken; the newcomer arrives before it runs
        newcomer = await enqueue(queue, slots)
        assert await asyncio.wait_for(first, 1) == "slot"
        assert not newcomer.done() and queue.num_waiting == 1
        slots.give()
        assert await asyncio.wait_for(newcomer, 1) == "slot"

    asyncio.run(main())


def test_a_full_queue_refuses_naming_its_limit_and_field():
    async def main():
        queue, slots, _ = make(0, max_queued=2)
        waiting = [await enqueue(queue, slots) for _ in range(2)]
        with pytest.raises(QueueFull) as refused:
            await queue.take(slots.try_take, None)
        message = str(refused.value)
        assert "2 requests wait" in message
        assert "max_queued (spec.controller.admission.maxQueued): 2" in message
        assert queue.num_waiting == 2
        for task in waiting:
            task.cancel()

    asyncio.run(main())


def test_by_default_the_queue_holds_four_times_the_slots():
    async def main():
        queue, slots, _ = make(2, max_queued=None)
        held = [await queue.take(slots.try_take, None) for _ in range(2)]
        waiting = [await enqueue(queue, slots) for _ in range(8)]
        with pytest.raises(QueueFull) as refused:
            await queue.take(slots.try_take, None)
        assert "4 x the 2 sequence slots of the READY workers" in str(refused.value)
        assert "spec.controller.admission.maxQueued" in str(refused.value)
        assert len(held) == 2
        for task in waiting:
            task.cancel()

    asyncio.run(main())


def test_a_deadline_that_passes_in_the_queue_ends_the_wait_naming_it():
    async def main():
        queue, slots, waits = make(0)
        with pytest.raises(QueueTimeout) as expired:
            await queue.take(slots.try_take, 0.2)
        message = str(expired.value)
        assert message.startswith("deadline exceeded after 0.")
        assert "in the admission queue, waiting for a worker slot" in message
        assert queue.num_waiting == 0
        assert len(waits.seconds) == 1 and waits.seconds[0] >= 0.2 - DEADLINE_MARGIN_S

    asyncio.run(main())


def test_the_longest_wait_is_the_manifests_and_named():
    async def main():
        queue, slots, _ = make(0, max_wait_s=0.05)
        with pytest.raises(QueueTimeout) as expired:
            await queue.take(slots.try_take, 30.0)  # its own deadline is later
        message = str(expired.value)
        assert "max_queue_wait_s (spec.controller.admission.maxQueueWaitS): 0.05 s" in message
        assert queue.num_waiting == 0

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_at_once_and_the_next_gets_the_slot():
    async def main():
        queue, slots, _ = make(0)
        first = await enqueue(queue, slots)
        second = await enqueue(queue, slots)
        first.cancel()
        await asyncio.sleep(0)
        assert queue.num_waiting == 1
        slots.give()
        assert await asyncio.wait_for(second, 1) == "slot"
        assert first.cancelled() and slots.num_free == 0  # no slot went to the cancelled one

    asyncio.run(main())


def test_a_slot_freed_on_another_thread_wakes_the_waiter_on_its_loop():
    async def main():
        queue, slots, _ = make(0)
        task = await enqueue(queue, slots)
        threading.Thread(target=slots.give).start()
        assert await asyncio.wait_for(task, 1) == "slot"

    asyncio.run(main())


def test_a_refusal_while_waiting_ends_every_waiter_with_it():
    async def main():
        queue, slots, _ = make(0)
        tasks = [await enqueue(queue, slots) for _ in range(3)]
        reason = Reason(ReasonCode.WORKER_NOT_SERVING, "no READY worker")
        slots.error = NotReady(reason)
        queue.wake()
        for task in tasks:
            with pytest.raises(NotReady):
                await asyncio.wait_for(task, 1)
        assert queue.num_waiting == 0

    asyncio.run(main())


def test_a_request_a_worker_refused_as_full_waits_first_past_the_bound_and_from_its_arrival():
    """It had its turn already: it goes to the head of the line, the queue's bound does not
    refuse it, and its longest wait counts from when it first came."""

    async def main():
        queue, slots, _ = make(0, max_queued=1, max_wait_s=0.5)
        waiting = await enqueue(queue, slots)
        came_s = time.monotonic() - 0.4
        again = asyncio.create_task(queue.take(slots.try_take, None, again_since_s=came_s))
        while queue.num_waiting == 1:
            await asyncio.sleep(0)
        slots.give()
        assert await asyncio.wait_for(again, 1) == "slot" and not waiting.done()
        late = asyncio.create_task(queue.take(slots.try_take, None, again_since_s=came_s))
        with pytest.raises(QueueTimeout) as expired:
            await asyncio.wait_for(late, 0.3)  # 0.1 s left of its 0.5 s, not 0.5 s more
        assert "the longest a request waits" in str(expired.value)
        waiting.cancel()

    asyncio.run(main())
