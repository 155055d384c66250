"""The channel to a server and the one shared `Inference.GenerateMany` call that carries every
stream of a client, on a grpc.aio channel of one event loop; the client's one failure type."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import grpc
from intentserve.client.credentials import Credentials
from intentserve.client.data import to_data
from intentserve.common.streaming import GENERATE_MANY_ACCEPTED, STREAM_READER_OPTIONS
from intentserve.common.tls import server_name
from intentserve.v1 import inference_pb2, inference_pb2_grpc


def open_channel(address: str, credentials: Credentials, *, aio: bool = False):
    """TLS when a CA is known for the server (verified by its name,
    `controller.<deployment>.intentserve`, or `router.` for a separate router); plaintext
    otherwise. `aio`: a grpc.aio channel, on
    the running event loop."""
    kind = grpc.aio if aio else grpc
    if credentials.ca_pem is None:
        return kind.insecure_channel(address, options=STREAM_READER_OPTIONS)
    return kind.secure_channel(
        address,
        grpc.ssl_channel_credentials(root_certificates=credentials.ca_pem),
        options=[
            (
                "grpc.ssl_target_name_override",
                server_name(credentials.deployment, credentials.server),
            ),
            *STREAM_READER_OPTIONS,
        ],
    )


class ClientError(grpc.RpcError):
    """Every failure of a call through either client, sync or async: `code()` and `details()`
    as the server ended it (for a request on the shared call, as its own call would have
    ended)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class SharedCall:
    """The asyncio client's `Inference.GenerateMany` call: each request's events reach its
    queue by key; commands are written in order by one task (one write at a time on a call)."""

    def __init__(self, channel: grpc.aio.Channel, metadata) -> None:
        self._call = inference_pb2_grpc.InferenceStub(channel).GenerateMany(metadata=metadata)
        self._queues: dict[int, Any] = {}  # key -> the request's queue (put_nowait)
        self._num_running: dict[int, int] = {}  # key -> its choices not yet finished
        self._keys = itertools.count(1)
        self._commands: asyncio.Queue = asyncio.Queue()
        self.ended: ClientError | None = None
        loop = asyncio.get_running_loop()
        self._tasks = (loop.create_task(self._read()), loop.create_task(self._write()))

    def open(self, request: inference_pb2.GenerateRequest, timeout_s: float | None, events) -> int:
        """Start `request`; its key. Its events (then, on the call's end, a ClientError)
        arrive in `events` (an asyncio.Queue, or a queue.SimpleQueue read by another thread)."""
        key = next(self._keys)
        self._queues[key] = events
        self._num_running[key] = request.n or 1
        command = inference_pb2.GenerateCommand(stream=key, start=request, timeout_s=timeout_s or 0)
        self._commands.put_nowait(command)
        return key

    def cancel(self, key: int) -> None:
        self._num_running.pop(key, None)
        if self._queues.pop(key, None) is not None and self.ended is None:
            self._commands.put_nowait(inference_pb2.GenerateCommand(stream=key, cancel=True))

    async def aclose(self) -> None:
        """End the call (the controller aborts what is left on it) and wait for its tasks."""
        self._call.cancel()
        self._tasks[1].cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            await self._call.code()  # grpc's own task for the call's status ends here

    async def _write(self) -> None:
        # NOTE: the first write waits for the controller to accept the call: a write that meets
        # a refused (ended) call would turn the refusal into INTERNAL (streaming.py).
        try:
            metadata = await self._call.initial_metadata()
        except Exception:  # the call has ended: the reader says how
            return
        if metadata.get(GENERATE_MANY_ACCEPTED[0]) != GENERATE_MANY_ACCEPTED[1]:
            return  # ended before it was accepted (trailers only): the reader says how
        while True:
            command = await self._commands.get()
            try:
                await self._call.write(command)
            except Exception:  # the call has ended: the reader says how
                return

    async def _read(self) -> None:
        ended = ClientError(grpc.StatusCode.UNAVAILABLE, "the controller ended the call")
        try:
            async for message in self._call:
                for event in message.events:
                    events = self._queues.get(event.stream)
                    if events is None:
                        continue  # cancelled here already
                    events.put_nowait(event)
                    if event.output.finish_reason:
                        self._num_running[event.stream] -= 1
                    if event.HasField("error") or not self._num_running[event.stream]:
                        del self._queues[event.stream], self._num_running[event.stream]
        except grpc.RpcError as error:
            ended = ClientError(error.code(), error.details() or "the call ended")
        except asyncio.CancelledError:
            ended = ClientError(grpc.StatusCode.CANCELLED, "the client was closed")
        finally:
            self.ended = ended
            left, self._queues = self._queues, {}
            for events in left.values():
                events.put_nowait(ended)


DEADLINE_GRACE_S = 1.0


def chunk_of(event: inference_pb2.GenerateEvent | ClientError) -> tuple[dict[str, Any], bool]:
    """One request's event on a shared call as its own call would read: a chunk and whether
    it is its choice's last (the request's, once every choice's came: GenerateRequest.n), or
    (raised) the error its call would have ended with."""
    if isinstance(event, ClientError):
        raise event
    if event.HasField("error"):
        code = _CODES.get(event.error.code, grpc.StatusCode.UNKNOWN)
        raise ClientError(code, event.error.details)
    return to_data(event.output), bool(event.output.finish_reason)


class Streams:
    """A client's requests on its shared call (a new one once the last has ended) over a
    grpc.aio channel; used on one event loop."""

    def __init__(self, address: str, credentials: Credentials, metadata) -> None:
        self._address = address
        self._credentials = credentials
        self._metadata = metadata
        self._channel: grpc.aio.Channel | None = None
        self._shared: SharedCall | None = None
        self._closed = False

    def channel(self) -> grpc.aio.Channel:
        if self._closed:
            raise ValueError("the client is closed")
        if self._channel is None:
            self._channel = open_channel(self._address, self._credentials, aio=True)
        return self._channel

    def start(
        self, request: inference_pb2.GenerateRequest, timeout_s: float | None, events
    ) -> tuple[SharedCall, int]:
        """Start `request` with `events` as its queue; the call it runs on and its key."""
        if self._shared is None or self._shared.ended is not None:
            self._shared = SharedCall(self.channel(), self._metadata)
        return self._shared, self._shared.open(request, timeout_s, events)

    async def aclose(self) -> None:
        self._closed = True
        if self._shared is not None:
            await self._shared.aclose()
            self._shared = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
