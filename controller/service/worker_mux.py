"""The controller's side of `WorkerStreams.Serve`: all requests to one worker on one call.

    mux = WorkerMux(channel, "local-0")
    stream = mux.open(request, timeout_s=30.0)  # sends the start command
    for response in stream:                      # GenerateResponse, as its own call would give
        ...
    stream.cancel()                              # sends the cancel command; ends it here at once

The worker sends one message per engine step with every request's news; the mux's reader thread
hands each event to its request's queue, where the thread serving that client takes it. A
request's failure arrives as `StreamFailed`, an `RpcError` with the code and details its own call
would have ended with, so the router treats both alike. When the call itself ends (the worker
died, its server stopped, the channel closed) every request still on it fails with that status
(UNAVAILABLE, also when the worker's server cancelled the call), and the next `open` on a closed
mux is refused (the caller makes a new one).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Iterator

import grpc
from intentserve.streaming import END, HandOver
from intentserve.v1 import inference_pb2, worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class StreamFailed(grpc.RpcError):
    """One request's end on the multiplexed call, read as its own call's error would be."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class MuxStream(HandOver):
    """One request on a worker's multiplexed call; iterate it for its responses (a
    GenerateResponse each; a failure is raised as StreamFailed)."""

    def __init__(self, mux: WorkerMux, key: int) -> None:
        super().__init__()
        self._mux = mux
        self.key = key

    def cancel(self) -> None:
        """Abort the request on the worker and end this stream with CANCELLED now (a no-op once
        it has ended)."""
        if self._mux.cancel(self.key):
            self._items.put(StreamFailed(grpc.StatusCode.CANCELLED, "cancelled by the caller"))

    def _put(self, item: object) -> None:
        self._items.put(item)


class WorkerMux:
    """One `WorkerStreams.Serve` call on `channel`, and the requests on it by key."""

    def __init__(self, channel: grpc.Channel, worker_id: str) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._streams: dict[int, MuxStream] = {}
        self._keys = itertools.count(1)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._ended: StreamFailed | None = None
        self._closing = False  # close() was called: a CANCELLED end is ours
        self._call = worker_pb2_grpc.WorkerStreamsStub(channel).Serve(self._command_stream())
        self._reader = threading.Thread(target=self._read, name=f"mux-{worker_id}", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._ended is not None

    def open(self, request: inference_pb2.GenerateRequest, timeout_s: float | None) -> MuxStream:
        """Start `request` on the worker; StreamFailed (UNAVAILABLE) when the call has ended."""
        with self._lock:
            if self._ended is not None:
                raise self._ended
            stream = MuxStream(self, next(self._keys))
            self._streams[stream.key] = stream
        self._commands.put(
            worker_pb2.StreamCommand(stream=stream.key, start=request, timeout_s=timeout_s or 0.0)
        )
        return stream

    def cancel(self, key: int) -> bool:
        """Forget `key` and tell the worker to abort it; False when it had already ended."""
        with self._lock:
            if self._streams.pop(key, None) is None:
                return False
        self._commands.put(worker_pb2.StreamCommand(stream=key, cancel=True))
        return True

    def close(self) -> None:
        """End the call: the worker aborts what is left, and every open stream fails here."""
        self._closing = True
        self._call.cancel()

    def _command_stream(self) -> Iterator[worker_pb2.StreamCommand]:
        while (command := self._commands.get()) is not None:
            yield command

    def _read(self) -> None:
        ended = StreamFailed(
            grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id} ended its multiplexed stream"
        )
        try:
            for message in self._call:
                self._dispatch(message)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or "the call ended"
            if code is grpc.StatusCode.CANCELLED and not self._closing:
                # NOTE: not by us: the worker's server stopped (a dead process reads UNAVAILABLE).
                code = grpc.StatusCode.UNAVAILABLE
                details = f"worker {self.worker_id}'s server cancelled its multiplexed stream"
            ended = StreamFailed(code, details)
        except Exception:  # NOTE: never leave streams waiting on a reader that died
            log.exception("reading worker %s's multiplexed stream failed", self.worker_id)
        finally:
            with self._lock:
                self._ended = ended
                left, self._streams = self._streams, {}
            for stream in left.values():
                stream._put(ended)
            self._commands.put(None)

    def _dispatch(self, message: worker_pb2.StreamEvents) -> None:
        deliveries: list[tuple[MuxStream, object]] = []
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
                        del streams[event.stream]
                        deliveries.append((stream, END))
                else:
                    del streams[event.stream]
                    code = _CODES.get(event.error.code, grpc.StatusCode.UNKNOWN)
                    deliveries.append((stream, StreamFailed(code, event.error.details)))
        for stream, item in deliveries:
            stream._put(item)
