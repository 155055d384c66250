"""`WorkerStreams.Serve`: the controller's requests to this worker on one multiplexed call.

Commands come in (start a request under a key, cancel a key); one `StreamEvents` message goes
out per engine step with every request's news, instead of one message per request per token.
That is what the served path costs per token: with 64 streams, a step's 64 messages (each a
wake-up of its own handler thread, a serialization and a write) become one.

Threads of one call:
- grpc's handler thread runs `Serve`: it waits on the call's `Outbox` and sends each batch;
- a reader thread takes the commands in order (start, cancel);
- the servicer's few prepare threads check and tokenize each started request (a long prompt
  never holds up the commands behind it), then hand it to the engine loop without waiting.

Every request keeps its own outcome: a refusal (no slot, a bad field) or a failure is an error
event for its key alone, with the status its own call would have had. A request of n choices
(`GenerateRequest.n`) takes n slots and streams every choice under its key, which ends with the
last choice's finished output. Ending the call, from
either side, aborts every request still on it. A start's `timeout_s` is enforced here too.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
from intentserve.common.status import fit_status_message, lookup, status_details
from intentserve.v1 import worker_pb2, worker_pb2_grpc
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoop
from intentserve.worker.service.interceptor import STATUS_CODES
from intentserve.worker.service.request_stream import Outbox, RequestStream
from intentserve.worker.service.servicer import StreamSlots

log = logging.getLogger(__name__)

PREPARE_THREADS = 2
# Events per message at most, and bytes by an upper bound of each event's size (one over it goes
# alone): a controller that fell behind gets its backlog in pieces, each far below the 4 MiB its
# channel receives. An event carries up to streamInterval tokens of text, so a backlog's events
# of a large interval could pass that limit, which would end the call and every request on it.
MAX_EVENTS_PER_MESSAGE = 1024
MAX_MESSAGE_BYTES = 1 << 20
_PREPARING = object()  # a key whose request is being checked and tokenized


class StreamsServicer(worker_pb2_grpc.WorkerStreamsServicer):
    def __init__(self, loop: EngineLoop, worker_id: str, slots: StreamSlots) -> None:
        self._loop = loop
        self._worker_id = worker_id
        self._slots = slots
        self._prepare = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix=f"{worker_id}-prep")

    def Serve(
        self, request_iterator: Iterator[worker_pb2.StreamCommand], context: grpc.ServicerContext
    ) -> Iterator[worker_pb2.StreamEvents]:
        session = _Session(self._loop, self._worker_id, self._slots, self._prepare)
        if not context.add_callback(session.close):
            return
        reader = threading.Thread(
            target=session.read, args=(request_iterator,), name="mux-commands", daemon=True
        )
        reader.start()
        try:
            yield from session.send()
        finally:
            session.close()

    def close(self) -> None:
        self._prepare.shutdown(wait=False, cancel_futures=True)


class _Session:
    """One `Serve` call: its requests by key, their deadlines, and its outbox."""

    def __init__(
        self, loop: EngineLoop, worker_id: str, slots: StreamSlots, prepare: ThreadPoolExecutor
    ) -> None:
        self._loop = loop
        self._worker_id = worker_id
        self._slots = slots
        self._prepare = prepare
        self.outbox = Outbox()
        self._lock = threading.Lock()
        self._streams: dict[int, object] = {}  # key -> RequestStream or _PREPARING; holds slots
        self._num_slots: dict[int, int] = {}  # key -> slots it holds: its choices
        self._num_running: dict[int, int] = {}  # key -> its choices not yet finished
        self._cancel_early: set[int] = set()  # cancelled while preparing
        self._deadlines: list[tuple[float, int, RequestStream]] = []  # a heap
        self._closed = False
        self._error: BaseException | None = None  # a command that did not parse ends the call

    # -- the reader thread -------------------------------------------------------------------

    def read(self, commands: Iterator[worker_pb2.StreamCommand]) -> None:
        try:
            for command in commands:
                kind = command.WhichOneof("command")
                if kind == "start":
                    self._start(command.stream, command.start, command.timeout_s)
                elif kind == "cancel":
                    self._cancel(command.stream)
        except grpc.RpcError:
            pass  # the call ended: close() below aborts what is left
        except Exception as error:  # a malformed command: the interceptor's status, from send()
            self._error = error
        finally:
            self.close()

    def _start(self, key: int, request, timeout_s: float) -> None:
        with self._lock:
            if self._closed:
                return
            if key in self._streams:
                self.outbox.put_now(key, ValueError(f"stream: key {key} is already in use"))
                return
            n = convert.num_choices(request)
            try:
                self._loop.engine.check_num_choices(n)
                self._slots.acquire(n)
            except Exception as refusal:
                self.outbox.put_now(key, refusal)
                return
            self._streams[key] = _PREPARING
            self._num_slots[key] = self._num_running[key] = n
        try:
            self._prepare.submit(self._prepare_and_start, key, request, timeout_s)
        except RuntimeError as error:  # the server is stopping
            self._refuse(key, error)

    def _cancel(self, key: int) -> None:
        with self._lock:
            stream = self._streams.get(key)
            if stream is _PREPARING:
                self._cancel_early.add(key)
                return
        if stream is not None:
            stream.cancel()

    # -- a prepare thread --------------------------------------------------------------------

    def _prepare_and_start(self, key: int, request, timeout_s: float) -> None:
        try:
            call = convert.generate_request_from_pb(request)
            with convert.proto_field_names():
                prepared = self._loop.engine.prepare(
                    call.prompt, call.params, call.request_id, chat=call.chat
                )
            stream = self._loop.start(prepared, self.outbox, key, call.n)
        except Exception as error:
            self._refuse(key, error)
            return
        with self._lock:
            live = self._streams.get(key) is _PREPARING and key not in self._cancel_early
            self._cancel_early.discard(key)
            if self._streams.get(key) is _PREPARING:
                self._streams[key] = stream
            if live and timeout_s > 0:
                heapq.heappush(self._deadlines, (time.monotonic() + timeout_s, key, stream))
        if not live:
            stream.cancel()  # its ABORT output ends it (or nobody reads it: the call is over)

    def _refuse(self, key: int, error: BaseException) -> None:
        if self._release(key):
            self.outbox.put_now(key, error)

    # -- the handler thread ------------------------------------------------------------------

    def send(self) -> Iterator[worker_pb2.StreamEvents]:
        while True:
            batch = self.outbox.get(self._time_to_next_deadline())
            self._expire_deadlines()
            if self._closed:  # what is left belongs to requests close() aborted
                if self._error is not None:
                    raise self._error
                return
            if not batch:
                continue
            for piece in pieces(batch):
                message = self._encode(piece)
                if message.events:
                    yield message

    def _encode(self, batch: list[tuple[int, object]]) -> worker_pb2.StreamEvents:
        message = worker_pb2.StreamEvents()
        for key, item in batch:
            event = message.events.add(stream=key)
            if isinstance(item, BaseException):
                code, details = lookup(STATUS_CODES, item)
                event.error.code = code.value[0]
                event.error.details = fit_status_message(details)
                event.error.status_details.extend(status_details(item))
                self._release(key)
            else:
                convert.fill_generate_response(event.output, item, self._worker_id)
                if item.finished and self._finish_choice(key):
                    self._release(key)
        return message

    def _time_to_next_deadline(self) -> float | None:
        with self._lock:
            if not self._deadlines:
                return None
            return max(0.0, self._deadlines[0][0] - time.monotonic())

    def _expire_deadlines(self) -> None:
        expired: list[RequestStream] = []
        now = time.monotonic()
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, key, stream = heapq.heappop(self._deadlines)
                if self._streams.get(key) is stream:
                    expired.append(stream)
        for stream in expired:
            stream.cancel()  # its ABORT output ends it

    # -- any thread --------------------------------------------------------------------------

    def _finish_choice(self, key: int) -> bool:
        """One of the key's choices finished: whether it was the last."""
        with self._lock:
            if key not in self._num_running:
                return False  # it has ended already
            self._num_running[key] -= 1
            return self._num_running[key] == 0

    def _release(self, key: int) -> bool:
        """The key's end: give back its slots (once). False when it had already ended."""
        with self._lock:
            if self._streams.pop(key, None) is None:
                return False
            self._num_running.pop(key, None)
            num = self._num_slots.pop(key)
        self._slots.release(num)
        return True

    def close(self) -> None:
        """The call is over: abort every request still on it and give back their slots."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            left, self._streams = self._streams, {}
            num_slots, self._num_slots = self._num_slots, {}
            self._deadlines.clear()
        for key, stream in left.items():
            self._slots.release(num_slots[key])
            if isinstance(stream, RequestStream):
                stream.cancel()
        if left:
            log.info("multiplexed call ended: %d request(s) aborted", len(left))
        self.outbox.close()


def pieces(batch: list[tuple[int, object]]) -> Iterator[list[tuple[int, object]]]:
    """`batch` in order, cut into messages' worth: MAX_EVENTS_PER_MESSAGE events at most, and
    MAX_MESSAGE_BYTES by an upper bound of their encoded size (an event over it goes alone)."""
    piece: list[tuple[int, object]] = []
    size = 0
    for key, item in batch:
        bound = _size_bound(item)
        if piece and (len(piece) == MAX_EVENTS_PER_MESSAGE or size + bound > MAX_MESSAGE_BYTES):
            yield piece
            piece, size = [], 0
        piece.append((key, item))
        size += bound
    if piece:
        yield piece


def _size_bound(item: object) -> int:
    """At least an event's encoded size: its ids (up to 256 characters each,
    intentserve.common.ids), 4 bytes a character of text (tool calls' too), 5 a token id, and the
    fixed fields' tags and numbers."""
    if isinstance(item, BaseException):
        return 1024 + 64  # the details are cut to 1 KiB (fit_status_message)
    calls = sum(16 + len(c.id) + len(c.name) + len(c.arguments) for c in item.tool_calls)
    return (
        64
        + 4 * (len(item.request_id) + 256)
        + 4 * (len(item.new_text) + len(item.new_reasoning) + calls)
        + 5 * len(item.new_token_ids)
    )
