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
aborted).

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
from intentserve.worker.engine.request import PreparedRequest, RequestOutput
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service.request_stream import (
    EngineLoopClosedError,
    Outbox,
    RequestFailedError,
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
        self._streams: dict[str, RequestStream] = {}  # NOTE: touched on the loop thread only
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
        self._enqueue(None, self._add_started, (prepared, stream))
        return stream

    def abort(self, request_id: str) -> bool:
        """Abort a request (every choice of it) and free its KV; False when it is unknown or
        already finished."""
        return self._call(self._abort, (request_id,))

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
            self._enqueue(None, self._abort_stream, (stream,))

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
                    "engine loop failed; failing %d in-flight request(s)", len(self._streams)
                )
                self._fail_all(error)
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
        for request_id in self.engine.add_choices(prepared, n):
            self._streams[request_id] = stream
        return stream

    def _add_started(self, prepared: PreparedRequest, stream: RequestStream) -> None:
        try:
            request_ids = self.engine.add_choices(prepared, len(stream.choice_ids))
        except Exception as error:
            stream._fail(error)
        else:
            for request_id in request_ids:
                self._streams[request_id] = stream
        finally:
            stream.outbox.flush()

    def _abort(self, request_id: str) -> bool:
        stream = self._streams.get(request_id)
        if stream is None:
            return self.engine.abort(request_id)
        self._abort_stream(stream)
        return True

    def _abort_stream(self, stream: RequestStream) -> None:
        """Abort every choice of `stream` still running; each ends with an ABORT output."""
        # NOTE: only the ids that are this stream's: a stream whose add was refused because
        # another request holds the id must never abort that one.
        if self._drop(stream):
            stream._put_aborted()
            if stream.outbox is not None:
                stream.outbox.flush()

    def _drop(self, stream: RequestStream) -> bool:
        """Abort the choices of `stream` still in the engine and forget them; whether any was."""
        live = [r for r in stream.choice_ids if self._streams.get(r) is stream]
        for request_id in live:
            del self._streams[request_id]
            self.engine.abort(request_id)
        return bool(live)

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
        # A request fails whole: the other choices of one that failed are aborted first.
        failed = {
            o.request_id: self._streams[o.request_id]
            for o in outputs
            if o.finish_reason is FinishReason.ERROR and o.request_id in self._streams
        }
        for stream in failed.values():
            self._drop(stream)
        # NOTE: refreshed before the outputs go out, so a consumer never sees an older load.
        self._load = self._read_load()
        outboxes: set[Outbox] = set()
        for output in outputs:
            stream = failed.get(output.request_id) or self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finish_reason is FinishReason.ERROR:
                stream._fail(RequestFailedError(stream.request_id, output.error))
            else:
                if output.finished:
                    _log_finished(output)  # NOTE: before its reader can see the end
                stream._put(output)
            if output.finished:
                self._streams.pop(output.request_id, None)
            if stream.outbox is not None:
                outboxes.add(stream.outbox)
        for outbox in outboxes:  # one batch per outbox per step
            outbox.flush()

    def _fail_all(self, error: Exception) -> None:
        for stream in {id(s): s for s in self._streams.values()}.values():
            try:
                self._drop(stream)
            except Exception:
                log.exception("aborting %s after the failure failed too", stream.request_id)
            stream._fail(error)
            if stream.outbox is not None:
                stream.outbox.flush()
        self._streams.clear()

    def _shut_down(self) -> None:
        with self._wakeup:
            ops, self._ops = self._ops, deque()
        closed = EngineLoopClosedError("the engine loop is closed")
        for future, op, args in ops:
            if future is not None:
                future.set_exception(closed)
            elif op == self._add_started:  # a started request that never reached the engine
                _, stream = args
                stream._fail(closed)
                stream.outbox.flush()
        self._fail_all(closed)
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


def _log_finished(output: RequestOutput) -> None:
    """One line per finished request, named by the id the controller routed it with (the HTTP
    client's X-Request-Id, when it sent one), so one id follows it through every log."""
    reason = output.finish_reason.value if output.finish_reason is not None else ""
    log.info(
        "request %s finished: %s, %d prompt + %d generated tokens",
        output.request_id,
        reason,
        output.num_prompt_tokens,
        output.num_output_tokens,
        extra={
            "fields": {
                "request_id": output.request_id,
                "finish_reason": reason,
                "num_prompt_tokens": output.num_prompt_tokens,
                "num_output_tokens": output.num_output_tokens,
            }
        },
    )
