"""Channel options for the callers that read token streams (the controller from its workers, a
client from the controller).

NOTE: with grpc's default a unary-stream call's messages arrive on the channel's own polling
thread, which then wakes the reading thread: two thread switches per message, so per generated
token, on each hop. On two cores those switches take time from the engine's torch threads.
`SingleThreadedUnaryStream` reads each message on the thread that iterates the call. Such a call
still ends from another thread with `cancel()`; it offers no blocking `result()` (unused here).
"""

from __future__ import annotations

import grpc
import grpc.experimental

STREAM_READER_OPTIONS: tuple[tuple[str, int], ...] = (
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)
