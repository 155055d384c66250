"""Clients of a running controller: Admin, Inference and health over one channel.

    with ControllerClient("127.0.0.1:50051") as client:          # the CLI's, blocking
        for chunk in client.generate("Hello", max_tokens=8): ...

    async with AsyncControllerClient("127.0.0.1:50051") as client:  # for asyncio applications
        async for chunk in client.generate("Hello", max_tokens=8): ...

The one place where the CLI touches protobuf: every response becomes plain data here (the same
dicts feed the tables and `--json`). Enum values read as lower-case words ("ready", "paged"),
an unset message as None, and every other field is present with its value.

Both clients put every stream of one client on one call (`Inference.GenerateMany`), whose
messages carry what the controller has for many streams at once: the blocking client from any
number of threads (its call lives on an event loop in a thread of its own), the asyncio client
on its loop. Measured on the 2-core AMD EPYC, 64 streams of a served bf16 model, alternated on
one deployment (README, Python clients): the blocking client's process 39-43 us of CPU per token
(a thread per stream, woken per token) where a call per stream had cost 78-87, the asyncio
client's 24-27, and the controller 34-38 against 70-76. A lone stream pays for the loop's hop:
the client ~0.1 ms more CPU per token, its rate unchanged within the noise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.controller.cli.credentials import Credentials
from intentserve.controller.cli.credentials import load as load_credentials
from intentserve.streaming import GENERATE_MANY_ACCEPTED, STREAM_READER_OPTIONS
from intentserve.tls import server_name
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc

DEFAULT_CONTROLLER = "127.0.0.1:50051"


def _bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _enum_word(field: FieldDescriptor, number: int) -> str:
    """`WORKER_STATE_READY` -> "ready": the name less the prefix its `*_UNSPECIFIED` value has."""
    enum_type = field.enum_type
    prefix = enum_type.values[0].name.removesuffix("UNSPECIFIED")
    value = enum_type.values_by_number.get(number)
    return value.name.removeprefix(prefix).lower() if value is not None else str(number)


def to_data(msg: Message) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.is_repeated:
            data[field.name] = [_value(field, v) for v in value]
        elif field.message_type is not None and not msg.HasField(field.name):
            data[field.name] = None
        elif field.has_presence and field.message_type is None and not msg.HasField(field.name):
            data[field.name] = None  # an `optional` scalar left unset
        else:
            data[field.name] = _value(field, value)
    return data


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_data(value)
    if field.enum_type is not None:
        return _enum_word(field, value)
    return value


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


_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


class RequestValueError(ValueError):
    """A value a request's field cannot carry; the message names the field and what it allows."""


def _check_fits(field: str, value: int, largest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= largest:
        raise RequestValueError(f"{field}: {value!r}; allowed: an integer from 0 to {largest}")


def check_timeout(timeout_s: float | None) -> None:
    """A request's `timeout_s`: None (no deadline) or finite seconds > 0; else RequestValueError
    naming it (a wait of none or of -1 s is no deadline, and would read as one that passed)."""
    if timeout_s is None:
        return
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not (math.isfinite(timeout_s) and timeout_s > 0)
    ):
        raise RequestValueError(
            f"timeout_s: {timeout_s!r}; allowed: finite seconds > 0, or None for no deadline"
        )


def generate_request(
    prompt: str,
    *,
    chat: bool,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop: list[str] | None,
    ignore_eos: bool,
) -> inference_pb2.GenerateRequest:
    """The request, or RequestValueError naming a value its field cannot carry (what the values
    mean, e.g. max_tokens within the model length, is the worker's check)."""
    _check_fits("max_tokens", max_tokens, _UINT32_MAX)
    _check_fits("top_k", top_k, _UINT32_MAX)
    if seed is not None:
        _check_fits("seed", seed, _UINT64_MAX)
    sampling = inference_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    if seed is not None:
        sampling.seed = seed
    return inference_pb2.GenerateRequest(
        prompt=prompt,
        chat=chat,
        sampling=sampling,
        stop=inference_pb2.StopConditions(
            max_tokens=max_tokens, stop=stop or [], ignore_eos=ignore_eos
        ),
    )


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
        credentials = credentials if credentials is not None else load_credentials(address)
        self._admin_auth = _bearer(credentials.admin_token)
        self._client_auth = _bearer(credentials.api_key or credentials.admin_token)
        self._channel = open_channel(address, credentials)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        # The streams' shared call and its event loop thread, made at the first generate.
        self._streams = _Streams(address, credentials, self._client_auth)
        self._loop: _LoopThread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def status(self) -> dict[str, Any]:
        request = admin_pb2.StatusRequest()
        return to_data(
            self._admin.Status(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def explain(self, worker_id: str) -> dict[str, Any]:
        request = admin_pb2.ExplainRequest(worker_id=worker_id)
        return to_data(
            self._admin.Explain(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def drain(self, worker_id: str, *, force: bool = False) -> dict[str, Any]:
        request = admin_pb2.DrainRequest(worker_id=worker_id, force=force)
        return to_data(
            self._admin.Drain(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def resume(self, worker_id: str) -> dict[str, Any]:
        request = admin_pb2.ResumeRequest(worker_id=worker_id)
        return to_data(
            self._admin.Resume(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def shutdown(self) -> None:
        self._admin.Shutdown(
            admin_pb2.ShutdownRequest(), timeout=self.timeout_s, metadata=self._admin_auth
        )

    def health(self, service: str = "") -> str:
        """ "serving", "not_serving", ... as `grpc.health.v1` reports it."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._health.Check(request, timeout=self.timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status).lower()

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
        timeout_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream the chunks of one generation (`text`, `token_ids`, ..., `finish_reason` last).
        Safe from many threads at once: their streams share the client's one call. An error is
        a `grpc.RpcError` (`RequestFailed`) with the code and details the request's own
        `Generate` call would have ended with. Leaving the loop early (or closing the iterator)
        cancels the request on its worker; the controller holds the request to `timeout_s`."""
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
        )
        events: queue.SimpleQueue = queue.SimpleQueue()
        loop = self._loop_thread()
        shared, key = loop.call(self._streams.start, request, timeout_s, events)
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
                    raise RequestFailed(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no answer from the controller within timeout_s ({timeout_s} s) "
                        f"+ {DEADLINE_GRACE_S} s",
                    ) from None
                ended = True  # unless it reads as a chunk that does not finish the request
                chunk, ended = _chunk(event)
                yield chunk
        finally:
            if not ended:
                loop.soon(shared.cancel, key)

    def _loop_thread(self) -> _LoopThread:
        with self._lock:
            if self._closed:
                raise ValueError("the client is closed")
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    def close(self) -> None:
        """End the streams' call (what still runs on it ends CANCELLED) and the channels."""
        with self._lock:
            loop, self._loop, self._closed = self._loop, None, True
        if loop is not None:
            with contextlib.suppress(Exception):  # closing: what is left ends with the loop
                loop.run(self._streams.aclose(), timeout_s=10)
            loop.close()
        self._channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class RequestFailed(grpc.RpcError):
    """One request's end on the asyncio client's shared call, read as its own call's error
    would be: `code()` and `details()`."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _SharedCall:
    """The asyncio client's `Inference.GenerateMany` call: each request's events reach its
    queue by key; commands are written in order by one task (one write at a time on a call)."""

    def __init__(self, channel: grpc.aio.Channel, metadata) -> None:
        self._call = inference_pb2_grpc.InferenceStub(channel).GenerateMany(metadata=metadata)
        self._queues: dict[int, Any] = {}  # key -> the request's queue (put_nowait)
        self._keys = itertools.count(1)
        self._commands: asyncio.Queue = asyncio.Queue()
        self.ended: RequestFailed | None = None
        loop = asyncio.get_running_loop()
        self._tasks = (loop.create_task(self._read()), loop.create_task(self._write()))

    def open(self, request: inference_pb2.GenerateRequest, timeout_s: float | None, events) -> int:
        """Start `request`; its key. Its events (then, on the call's end, a RequestFailed)
        arrive in `events` (an asyncio.Queue, or a queue.SimpleQueue read by another thread)."""
        key = next(self._keys)
        self._queues[key] = events
        command = inference_pb2.GenerateCommand(stream=key, start=request, timeout_s=timeout_s or 0)
        self._commands.put_nowait(command)
        return key

    def cancel(self, key: int) -> None:
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
        ended = RequestFailed(grpc.StatusCode.UNAVAILABLE, "the controller ended the call")
        try:
            async for message in self._call:
                for event in message.events:
                    events = self._queues.get(event.stream)
                    if events is None:
                        continue  # cancelled here already
                    events.put_nowait(event)
                    if event.HasField("error") or event.output.finish_reason:
                        del self._queues[event.stream]
        except grpc.RpcError as error:
            ended = RequestFailed(error.code(), error.details() or "the call ended")
        except asyncio.CancelledError:
            ended = RequestFailed(grpc.StatusCode.CANCELLED, "the client was closed")
        finally:
            self.ended = ended
            left, self._queues = self._queues, {}
            for events in left.values():
                events.put_nowait(ended)


DEADLINE_GRACE_S = 1.0


def _chunk(event: inference_pb2.GenerateEvent | RequestFailed) -> tuple[dict[str, Any], bool]:
    """One request's event on a shared call as its own call would read: a chunk and whether
    it is the last, or (raised) the error its call would have ended with."""
    if isinstance(event, RequestFailed):
        raise event
    if event.HasField("error"):
        code = _CODES.get(event.error.code, grpc.StatusCode.UNKNOWN)
        raise RequestFailed(code, event.error.details)
    return to_data(event.output), bool(event.output.finish_reason)


class _Streams:
    """A client's requests on its shared call (a new one once the last has ended) over a
    grpc.aio channel; used on one event loop."""

    def __init__(self, address: str, credentials: Credentials, metadata) -> None:
        self._address = address
        self._credentials = credentials
        self._metadata = metadata
        self._channel: grpc.aio.Channel | None = None
        self._shared: _SharedCall | None = None
        self._closed = False

    def channel(self) -> grpc.aio.Channel:
        if self._closed:
            raise ValueError("the client is closed")
        if self._channel is None:
            self._channel = open_channel(self._address, self._credentials, aio=True)
        return self._channel

    def start(
        self, request: inference_pb2.GenerateRequest, timeout_s: float | None, events
    ) -> tuple[_SharedCall, int]:
        """Start `request` with `events` as its queue; the call it runs on and its key."""
        if self._shared is None or self._shared.ended is not None:
            self._shared = _SharedCall(self.channel(), self._metadata)
        return self._shared, self._shared.open(request, timeout_s, events)

    async def aclose(self) -> None:
        self._closed = True
        if self._shared is not None:
            await self._shared.aclose()
            self._shared = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class _LoopThread:
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

    def run(self, coro: Coroutine, timeout_s: float | None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def soon(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed, and the call with it
            self._loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


class AsyncControllerClient:
    """The controller's Inference, Status and health calls for asyncio applications: one
    grpc.aio channel, made on the event loop of the first call (use the client on that loop
    only). Every `generate` of the client shares one `Inference.GenerateMany` call: the tokens
    the controller has for many streams at once come in one message, not one per stream. Errors
    are `grpc.RpcError`s (`RequestFailed` for a request, `grpc.aio.AioRpcError` for Status and
    health) with the status the controller gave."""

    def __init__(
        self,
        address: str = DEFAULT_CONTROLLER,
        timeout_s: float = 10.0,
        credentials: Credentials | None = None,
    ) -> None:
        """`credentials` default to what `up` wrote for `address` (and the environment)."""
        self.address = address
        self.timeout_s = timeout_s
        self._credentials = credentials if credentials is not None else load_credentials(address)
        self._admin_auth = _bearer(self._credentials.admin_token)
        self._client_auth = _bearer(self._credentials.api_key or self._credentials.admin_token)
        self._streams = _Streams(address, self._credentials, self._client_auth)

    def _open(self) -> grpc.aio.Channel:
        return self._streams.channel()

    async def generate(
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
        timeout_s: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the chunks of one generation, as `ControllerClient.generate` does. Leaving the
        loop early (or the task being cancelled) cancels the request on its worker; the
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
        )
        events: asyncio.Queue = asyncio.Queue()
        shared, key = self._streams.start(request, timeout_s, events)
        ended = False
        try:
            while not ended:
                event = await events.get()
                ended = True  # unless it reads as a chunk that does not finish the request
                chunk, ended = _chunk(event)
                yield chunk
        finally:
            if not ended:
                shared.cancel(key)

    async def status(self) -> dict[str, Any]:
        stub = admin_pb2_grpc.AdminStub(self._open())
        request = admin_pb2.StatusRequest()
        return to_data(
            await stub.Status(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    async def health(self, service: str = "") -> str:
        """ "serving", "not_serving", ... as `grpc.health.v1` reports it."""
        stub = health_pb2_grpc.HealthStub(self._open())
        request = health_pb2.HealthCheckRequest(service=service)
        response = await stub.Check(request, timeout=self.timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status).lower()

    async def close(self) -> None:
        await self._streams.aclose()

    async def __aenter__(self) -> AsyncControllerClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
