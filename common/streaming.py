"""What both sides use to read token streams: channel options for the callers that read them
(the controller from its workers, a client from the controller), and `HandOver`, one reader's
queue of items put by another thread.

NOTE: with grpc's default a unary-stream call's messages arrive on the channel's own polling
thread, which then wakes the reading thread: two thread switches per message, so per generated
token, on each hop. On two cores those switches take time from the engine's torch threads.
`SingleThreadedUnaryStream` reads each message on the thread that iterates the call. Such a call
still ends from another thread with `cancel()`; it offers no blocking `result()` (unused here).
"""

from __future__ import annotations

import queue
from typing import Any

import grpc
import grpc.experimental

STREAM_READER_OPTIONS: tuple[tuple[str, int], ...] = (
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)


# The initial metadata the controller sends on an `Inference.GenerateMany` call once it has
# accepted it (its guard passed). A client writes its first command after it: grpc's asyncio
# client reports a write that meets an ended call as INTERNAL, hiding the status the controller
# ended it with (a refusal).
GENERATE_MANY_ACCEPTED: tuple[str, str] = ("intentserve-call", "accepted")

# The largest request the controller forwards, serialized (`GenerateRequest.ByteSize()`, its
# request id included); a larger one is refused alone, naming its largest field. Every request
# of a client goes to its worker on one multiplexed call, and a message over the worker's receive
# limit would end that call, and every other request on it.
MAX_REQUEST_BYTES = 4 << 20
# What the worker's server takes in one message: a start command is a request plus its key and
# timeout. The controller's server takes the same from its clients (a GenerateMany command).
MAX_COMMAND_BYTES = MAX_REQUEST_BYTES + (64 << 10)

END = object()  # put after a stream's last item


class HandOver:
    """Items put by one thread, iterated by another in order: iteration stops after `END`, and
    an exception put in the queue is raised (and ends it)."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._done = False  # set by the reader once it has seen the end

    def __iter__(self) -> HandOver:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item
