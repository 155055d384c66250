"""The engine loop: one background thread owns the engine and steps it while there is work.

Every engine call (add, abort, step, stats) runs on that thread, so the engine needs no locks.
Other threads hand it operations through a queue and wait for the result:

    stream = loop.submit("Hello", SamplingParams(max_tokens=8), "req-1")  # validates now
    for output in stream:  # RequestOutput deltas; the last one has finished=True
        ...

NOTE: operations queued while a step runs are applied before the next step, so a caller waits
at most one step; the loop never starves callers the way a lock re-taken in a tight loop can.

`start` is the non-blocking form for a multiplexed caller: a prepared request whose outputs go
to an `Outbox`, flushed once per step, so that one message can carry a step's tokens.

A request of `n` choices (`Engine.add_choices`) is one stream: its outputs carry their choice's
index, a cancel aborts every choice, and a choice that fails fails the request (the others are
aborted): `in_flight.py` keeps which stream each choice belongs to.

A request that fails alone (finish_reason ERROR) ends its own stream with RequestFailedError; a
step that raises fails every stream in flight, and `StepHealth` hears of each step's outcome.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.request import PreparedRequest
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.service.in_flight import InFlight
from intentserve.worker.service.request_stream import (
    EngineLoopClosedError,
    Outbox,
    RequestStream,
)
from intentserve.worker.service.step_health import StepHealth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineLoad:
    """What a heartbeat reports: sequences by state and KV cache blocks (or slots)."""

    num_running: int
    num_waiting: int
    num_kv_used: int
    num_kv_total: int
    num_preemptions: int = 0  # cumulative, like the two prefix-cache counts
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_steps: int = 0  # cumulative, with the two below: mean step duration and batch size
    total_step_s: float = 0.0
    num_step_seqs: int = 0  # sequences that advanced (a token or their end) in each step, summed


class EngineLoop:
    """Runs `engine.step()` on a background thread while requests are unfinished.

    An exception inside a step fails the streams in flight with that error (and aborts their
    sequences); the loop logs it, tells `health`, and keeps serving new requests.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        name: str = "engine-loop",
        health: StepHealth | None = None,
        stream_interval: int = 1,
    ) -> None:
        """`stream_interval`: tokens per delivery of each stream after its first (RequestStream);
        ValueError naming it when it is not a positive integer."""
        if type(stream_interval) is not int or stream_interval < 1:
            raise ValueError(f"stream_interval: {stream_interval!r}; allowed: an integer >= 1")
        self.engine = engine
        self.stream_interval = stream_interval
        self._health = health
        self._wakeup = threading.Condition()
        self._ops: deque[tuple[Future | None, Callable[..., Any], tuple]] = deque()
        self._closed = False
        self._has_work = False
        self._in_flight = InFlight(engine)  # NOTE: touched on the loop thread only
        self._num_steps = self._num_step_seqs = 0  # NOTE: these three too
        self._total_step_s = 0.0
        self._load = self._read_load()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the callers' surface (any thread) ---------------------------------------------------

    def submit(
        self,
        prompt: str | Sequence[int] | Conversation,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        chat: bool = False,
        n: int = 1,
    ) -> RequestStream:
        """Queue a request of `n` choices and return its stream; InvalidRequestError (naming
        the field) when the engine cannot serve it, EngineLoopClosedError after `close()`.

        NOTE: the request is checked and tokenized here, on the caller's thread, so a long
        prompt never holds up the steps of the requests already running."""
        prepared = self.engine.prepare(prompt, params, request_id, chat=chat)
        return self._call(self._add, (prepared, n))

    def start(
        self, prepared: PreparedRequest, outbox: Outbox, key: int, n: int = 1
    ) -> RequestStream:
        """Queue a prepared request of `n` choices (`engine.prepare`, on the caller's thread)
        and return at once; its outputs go to `outbox` under `key`. If the engine refuses it
        when it is added (its id already in flight), that error is its only item.
        EngineLoopClosedError after `close()`."""
        stream = self._stream(prepared.request_id, n, outbox, key)
        self._enqueue(None, self._in_flight.start, (prepared, stream))
        return stream

    def abort(self, request_id: str) -> bool:
        """Abort a request (every choice of it) and free its KV; False when it is unknown or
        already finished."""
        return self._call(self._in_flight.abort, (request_id,))

    def load(self) -> EngineLoad:
        """Load as of the latest step or operation (no waiting)."""
        return self._load

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float | None = 10.0) -> None:
        """Stop the thread after the current step; streams still in flight end with
        EngineLoopClosedError and their sequences are aborted. Idempotent."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def __enter__(self) -> EngineLoop:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, op: Callable[..., Any], args: tuple) -> Any:
        if threading.current_thread() is self._thread:
            return op(*args)
        future: Future = Future()
        self._enqueue(future, op, args)
        return future.result()

    def _cancel_later(self, stream: RequestStream) -> None:
        """What `RequestStream.cancel` does: queue an abort of that stream and return at once."""
        with contextlib.suppress(EngineLoopClosedError):  # close() ends every stream anyway
            self._enqueue(None, self._in_flight.abort_stream, (stream,))

    def _enqueue(self, future: Future | None, op: Callable[..., Any], args: tuple) -> None:
        with self._wakeup:
            if self._closed or not self._thread.is_alive():
                raise EngineLoopClosedError("the engine loop is closed")
            self._ops.append((future, op, args))
            self._wakeup.notify()

    # -- the loop thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._closed or self._ops or self._has_work)
                if self._closed:
                    break
                ops, self._ops = self._ops, deque()
            try:
                self._apply(ops)
                if self.engine.has_unfinished:
                    self._step()
                self._has_work = self.engine.has_unfinished
            except Exception as error:  # NOTE: one failure must never stop the loop
                log.exception(
                    "engine loop failed; failing %d in-flight request(s)", len(self._in_flight)
                )
                self._in_flight.fail_all(error)
                self._has_work = self.engine.has_unfinished
                self._load = self._read_load()
        self._shut_down()

    def _apply(self, ops: deque[tuple[Future | None, Callable[..., Any], tuple]]) -> None:
        """Run the queued operations, then answer their callers (before the next step)."""
        outcomes: list[tuple[Future, Any, Exception | None]] = []
        for future, op, args in ops:
            try:
                result, error = op(*args), None
            except Exception as exc:
                result, error = None, exc
            if future is not None:
                outcomes.append((future, result, error))
        try:
            # NOTE: refreshed first: an abort's caller may read load() as soon as it is answered.
            self._load = self._read_load()
        finally:
            for future, result, error in outcomes:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)

    def _stream(
        self, request_id: str, n: int, outbox: Outbox | None = None, key: int = 0
    ) -> RequestStream:
        return RequestStream(
            request_id,
            self._cancel_later,
            outbox,
            key,
            stream_interval=self.stream_interval,
            num_choices=n,
        )

    def _add(self, prepared: PreparedRequest, n: int) -> RequestStream:
        stream = self._stream(prepared.request_id, n)
        self._in_flight.add(prepared, stream)
        return stream

    def _step(self) -> None:
        started_s = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception:
            if self._health is not None:
                self._health.step_failed()
            raise
        if self._health is not None:
            self._health.step_succeeded()
        self._num_steps += 1
        self._total_step_s += time.perf_counter() - started_s
        self._num_step_seqs += len(outputs)
        failed = self._in_flight.drop_failed(outputs)
        # NOTE: refreshed before the outputs go out, so a consumer never sees an older load.
        self._load = self._read_load()
        self._in_flight.deliver(outputs, failed)

    def _shut_down(self) -> None:
        with self._wakeup:
            ops, self._ops = self._ops, deque()
        closed = EngineLoopClosedError("the engine loop is closed")
        for future, op, args in ops:
            if future is not None:
                future.set_exception(closed)
            elif op == self._in_flight.start:  # a started request that never reached the engine
                _, stream = args
                stream._fail(closed)
                stream.outbox.flush()
        self._in_flight.fail_all(closed)
        self._load = self._read_load()

    def _read_load(self) -> EngineLoad:
        stats = self.engine.scheduler.stats()
        return EngineLoad(
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_kv_used=stats.kv.num_used_blocks,
            num_kv_total=stats.kv.num_blocks,
            num_preemptions=stats.num_preemptions,
            num_prefix_queried_tokens=stats.kv.num_prefix_queried_tokens,
            num_prefix_hit_tokens=stats.kv.num_prefix_hit_tokens,
            num_steps=self._num_steps,
            total_step_s=self._total_step_s,
            num_step_seqs=self._num_step_seqs,
        )
