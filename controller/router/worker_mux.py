"""A router's side of `WorkerStreams.Serve`: all requests to one worker on one call.

    mux = WorkerMux(channel, "local-0")
    stream = mux.open(request, timeout_s=30.0)  # sends the start command
    for response in stream:                      # GenerateResponse, as its own call would give
        ...
    stream.cancel()                              # sends the cancel command; ends it here at once

    stream = mux.open(request, 30.0, loop=loop)  # async mode, for a handler on `loop`
    async for response in stream:
        ...

    mux = WorkerMux(aio_channel, "local-0", loop=loop)  # the call itself on `loop`

The worker sends one message per engine step with every request's news; the mux's reader hands
each event to its request's stream (`mux_streams.py`: the streams, their failure, the hand-over).

The call runs either on a sync channel, read by a thread of the mux's own, or (`loop=`) on a
grpc.aio channel made on that loop, read by a task there: a message then reaches the front end's
handlers with no thread in between. Measured on the 2-core AMD EPYC, one request at one message
per 8 ms, CPU of the reading process per message: ~780 us with the thread (grpc's channel-spin
thread wakes the reader, which wakes the loop), ~550 us on the loop (docs/engine.md). A
request's failure arrives as `StreamFailed`, an `RpcError` with the code and details its own call
would have ended with, so the router treats both alike. A request of n choices
(`GenerateRequest.n`) streams each choice's responses under its one key; its stream ends after
the last choice's finished response. When the call itself ends (the worker
died, its server stopped, the channel closed) every request still on it fails with that status
(UNAVAILABLE, also when the worker's server cancelled the call), and the next `open` on a closed
mux is refused (the caller makes a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Iterator

import grpc
from intentserve.common.field_errors import violation_in
from intentserve.common.streaming import END
from intentserve.controller.router.mux_streams import (
    AsyncMuxStream,
    MuxStream,
    Stream,
    StreamFailed,
    hand_over,
    running_loop,
)
from intentserve.v1 import inference_pb2, worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class WorkerMux:
    """One `WorkerStreams.Serve` call on `channel`, and the requests on it by key."""

    def __init__(
        self,
        channel: grpc.Channel | grpc.aio.Channel,
        worker_id: str,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """With `loop`, `channel` is a grpc.aio channel made on it, and the call runs there
        (made at once when this runs on the loop's thread, else waited for); without, a sync
        channel read by a thread of the mux's own."""
        self.worker_id = worker_id
        self.loop = loop
        self._lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._num_running: dict[int, int] = {}  # key -> its choices not yet finished
        self._keys = itertools.count(1)
        self._ended: StreamFailed | None = None
        self._closing = False  # close() was called: a CANCELLED end is ours
        self._reader: threading.Thread | None = None
        if loop is None:
            self._commands: queue.SimpleQueue = queue.SimpleQueue()
            self._call = worker_pb2_grpc.WorkerStreamsStub(channel).Serve(self._command_stream())
            self._reader = threading.Thread(target=self._read, name=f"mux-{worker_id}", daemon=True)
            self._reader.start()
        elif running_loop() is loop:
            self._start_on_loop(channel)
        else:
            asyncio.run_coroutine_threadsafe(self._astart(channel), loop).result()

    @property
    def closed(self) -> bool:
        return self._ended is not None

    def open(
        self,
        request: inference_pb2.GenerateRequest,
        timeout_s: float | None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Stream:
        """Start `request` on the worker; StreamFailed (UNAVAILABLE) when the call has ended.

        With `loop`, the stream is an AsyncMuxStream read on that loop; else a MuxStream read by
        one thread."""
        with self._lock:
            if self._ended is not None:
                raise self._ended
            key = next(self._keys)
            stream = MuxStream(self, key) if loop is None else AsyncMuxStream(self, key, loop)
            self._streams[stream.key] = stream
            self._num_running[stream.key] = request.n or 1
        self._send(
            worker_pb2.StreamCommand(stream=stream.key, start=request, timeout_s=timeout_s or 0.0)
        )
        return stream

    def cancel(self, key: int) -> bool:
        """Forget `key` and tell the worker to abort it; False when it had already ended."""
        with self._lock:
            if self._streams.pop(key, None) is None:
                return False
            del self._num_running[key]
        self._send(worker_pb2.StreamCommand(stream=key, cancel=True))
        return True

    def close(self) -> None:
        """End the call: the worker aborts what is left, and every open stream fails here.
        Callable from any thread."""
        self._closing = True
        if self.loop is None:
            self._call.cancel()
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed, and the call with it
            self.loop.call_soon_threadsafe(self._call.cancel)

    async def aclose(self) -> None:
        """`close()` on the call's own loop, returning once its reader and writer have ended:
        the call's last events have been handled on this loop, which may then close."""
        self._closing = True
        self._call.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _send(self, command: worker_pb2.StreamCommand) -> None:
        if self.loop is None:
            self._commands.put(command)
            return
        # NOTE: from every thread alike (the loop's own too), so commands keep their order.
        with contextlib.suppress(RuntimeError):  # the loop closed: every stream has ended
            self.loop.call_soon_threadsafe(self._queued.put_nowait, command)

    def _command_stream(self) -> Iterator[worker_pb2.StreamCommand]:
        while (command := self._commands.get()) is not None:
            yield command

    def _read(self) -> None:
        ended = self._default_end()
        try:
            for message in self._call:
                self._dispatch(message)
        except grpc.RpcError as error:
            ended = self._end_of(error.code(), error.details())
        except Exception:  # NOTE: never leave streams waiting on a reader that died
            log.exception("reading worker %s's multiplexed stream failed", self.worker_id)
        finally:
            self._finish(ended)
            self._commands.put(None)

    async def _astart(self, channel: grpc.aio.Channel) -> None:
        self._start_on_loop(channel)

    def _start_on_loop(self, channel: grpc.aio.Channel) -> None:
        self._queued: asyncio.Queue = asyncio.Queue()
        self._call = worker_pb2_grpc.WorkerStreamsStub(channel).Serve()
        self._tasks = (
            self.loop.create_task(self._aread(), name=f"mux-{self.worker_id}"),
            self.loop.create_task(self._awrite(), name=f"mux-{self.worker_id}-commands"),
        )

    async def _aread(self) -> None:
        """`_read` as a task on the loop."""
        ended = self._default_end()
        try:
            async for message in self._call:
                self._dispatch(message)
        except grpc.RpcError as error:
            ended = self._end_of(error.code(), error.details())
        except asyncio.CancelledError:  # the call was cancelled here (close), or the loop ends
            ended = StreamFailed(grpc.StatusCode.CANCELLED, "the multiplexed call was cancelled")
        except Exception:  # NOTE: never leave streams waiting on a reader that died
            log.exception("reading worker %s's multiplexed stream failed", self.worker_id)
        finally:
            self._finish(ended)
            self._queued.put_nowait(None)

    async def _awrite(self) -> None:
        """The commands, in the order they were sent, onto the call; ends with the reader."""
        while (command := await self._queued.get()) is not None:
            try:
                await self._call.write(command)
            except Exception as error:  # the call has ended: the reader reports how
                log.debug("worker %s's call took no command: %r", self.worker_id, error)
                return

    def _default_end(self) -> StreamFailed:
        return StreamFailed(
            grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id} ended its multiplexed stream"
        )

    def _end_of(self, code: grpc.StatusCode, details: str | None) -> StreamFailed:
        details = details or "the call ended"
        if code is grpc.StatusCode.CANCELLED and not self._closing:
            # NOTE: not by us: the worker's server stopped (a dead process reads UNAVAILABLE).
            code = grpc.StatusCode.UNAVAILABLE
            details = f"worker {self.worker_id}'s server cancelled its multiplexed stream"
        return StreamFailed(code, details)

    def _finish(self, ended: StreamFailed) -> None:
        with self._lock:
            self._ended = ended
            left, self._streams = self._streams, {}
            self._num_running.clear()
        hand_over((stream, ended) for stream in left.values())

    def _dispatch(self, message: worker_pb2.StreamEvents) -> None:
        deliveries: list[tuple[Stream, object]] = []
        with self._lock:  # NOTE: once per message, not per event
            streams = self._streams
            for event in message.events:
                stream = streams.get(event.stream)
                if stream is None:
                    continue  # cancelled here already
                if event.HasField("output"):
                    output = event.output
                    deliveries.append((stream, output))
                    if output.finish_reason:
                        self._num_running[event.stream] -= 1
                        if not self._num_running[event.stream]:  # its last choice's end
                            del streams[event.stream], self._num_running[event.stream]
                            deliveries.append((stream, END))
                else:
                    del streams[event.stream], self._num_running[event.stream]
                    code = _CODES.get(event.error.code, grpc.StatusCode.UNKNOWN)
                    violation = violation_in(event.error.status_details)
                    failure = StreamFailed(code, event.error.details, violation)
                    deliveries.append((stream, failure))
        hand_over(deliveries)
