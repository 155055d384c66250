"""The multiplexed call's async delivery: a message's items reach the event loop in one hand-over,
in order, and a cancel from another thread ends the stream there. (Items that wait together are
read as one response: tests/controller/test_coalesce.py; here the tokens are what is compared.)"""

import asyncio

import grpc
import pytest
from intentserve.common.streaming import END
from intentserve.controller.router.mux_streams import AsyncMuxStream, StreamFailed, hand_over
from intentserve.v1 import inference_pb2


class FakeMux:
    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def cancel(self, key: int) -> bool:
        self.cancelled.append(key)
        return True


class CountingLoop:
    """Stands in for the loop the reader thread hands items to; counts the hand-overs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.num_calls = 0

    def call_soon_threadsafe(self, callback, *args):
        self.num_calls += 1
        return self.loop.call_soon_threadsafe(callback, *args)


def response(token: int) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(token_ids=[token])


async def read(stream: AsyncMuxStream) -> list[int]:
    return [token async for r in stream for token in r.token_ids]


def test_a_messages_items_reach_the_loop_in_one_hand_over_and_in_order():
    async def scenario():
        loop = CountingLoop(asyncio.get_running_loop())
        mux = FakeMux()
        streams = [AsyncMuxStream(mux, key, loop) for key in (1, 2, 3)]
        # One message: a token for each stream, and the end of the first.
        hand_over([(s, response(10 + i)) for i, s in enumerate(streams)] + [(streams[0], END)])
        assert loop.num_calls == 1
        hand_over([(s, response(20 + i)) for i, s in enumerate(streams[1:], 1)])
        hand_over([(s, END) for s in streams[1:]])
        assert loop.num_calls == 3
        return [await read(s) for s in streams]

    assert asyncio.run(scenario()) == [[10], [11, 21], [12, 22]]


def test_a_cancel_from_another_thread_ends_the_stream_with_cancelled():
    async def scenario():
        loop = asyncio.get_running_loop()
        mux = FakeMux()
        stream = AsyncMuxStream(mux, 7, loop)
        hand_over([(stream, response(1))])
        await loop.run_in_executor(None, stream.cancel)
        assert mux.cancelled == [7]
        assert (await stream.__anext__()).token_ids == [1]
        with pytest.raises(StreamFailed) as error:
            await stream.__anext__()
        assert error.value.code() is grpc.StatusCode.CANCELLED
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    asyncio.run(scenario())


def test_a_waiting_reader_gets_every_item_in_order_and_its_cancel_ends_the_wait():
    async def scenario():
        loop = asyncio.get_running_loop()
        stream = AsyncMuxStream(FakeMux(), 3, loop)
        reader = asyncio.ensure_future(read(stream))
        for token in range(5):  # each item lands while the reader waits for it
            await asyncio.sleep(0)
            hand_over([(stream, response(token))])
        hand_over([(stream, response(5)), (stream, response(6)), (stream, END)])
        assert await reader == [0, 1, 2, 3, 4, 5, 6]

        waiting = AsyncMuxStream(FakeMux(), 4, loop)
        task = asyncio.ensure_future(waiting.__anext__())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        hand_over([(waiting, response(9)), (waiting, END)])  # no waiter left to wake
        assert await read(waiting) == [9]

    asyncio.run(scenario())
