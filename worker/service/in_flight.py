"""The requests in flight on the engine loop: which stream each choice's request id belongs to,
adding and aborting them in the engine, and handing each step's outputs to their streams.

A request of `n` choices is one stream; a choice that fails fails the request, so its other
choices are aborted first (`drop_failed`, then `deliver`). Everything here runs on the loop
thread (EngineLoop), so it takes no locks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.request import PreparedRequest, RequestOutput
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service.request_stream import Outbox, RequestFailedError, RequestStream

log = logging.getLogger(__name__)


class InFlight:
    """The streams of the requests the engine is running, by each choice's request id."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._streams: dict[str, RequestStream] = {}

    def __len__(self) -> int:
        """Choices in flight."""
        return len(self._streams)

    def add(self, prepared: PreparedRequest, stream: RequestStream) -> None:
        """Queue every choice of `stream` in the engine; raises as `Engine.add_choices` does."""
        for request_id in self._engine.add_choices(prepared, len(stream.choice_ids)):
            self._streams[request_id] = stream

    def start(self, prepared: PreparedRequest, stream: RequestStream) -> None:
        """`add` for a stream with an outbox: a refusal is its only item."""
        try:
            self.add(prepared, stream)
        except Exception as error:
            stream._fail(error)
        finally:
            stream.outbox.flush()

    def abort(self, request_id: str) -> bool:
        """Abort the request (every choice of its stream); False when it is unknown or already
        finished."""
        stream = self._streams.get(request_id)
        if stream is None:
            return self._engine.abort(request_id)
        self.abort_stream(stream)
        return True

    def abort_stream(self, stream: RequestStream) -> None:
        """Abort every choice of `stream` still running; each ends with an ABORT output."""
        # NOTE: only the ids that are this stream's: a stream whose add was refused because
        # another request holds the id must never abort that one.
        if self._drop(stream):
            stream._put_aborted()
            if stream.outbox is not None:
                stream.outbox.flush()

    def drop_failed(self, outputs: Sequence[RequestOutput]) -> dict[str, RequestStream]:
        """A request fails whole: the other choices of each one that failed in this step are
        aborted. The failed requests' streams, by the failed choice's id, for `deliver`."""
        failed = {
            o.request_id: self._streams[o.request_id]
            for o in outputs
            if o.finish_reason is FinishReason.ERROR and o.request_id in self._streams
        }
        for stream in failed.values():
            self._drop(stream)
        return failed

    def deliver(self, outputs: Sequence[RequestOutput], failed: dict[str, RequestStream]) -> None:
        """Hand a step's outputs to their streams (`failed` from `drop_failed`), then flush
        each outbox once."""
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

    def fail_all(self, error: Exception) -> None:
        """End every stream with `error`, aborting its choices still in the engine."""
        for stream in {id(s): s for s in self._streams.values()}.values():
            try:
                self._drop(stream)
            except Exception:
                log.exception("aborting %s after the failure failed too", stream.request_id)
            stream._fail(error)
            if stream.outbox is not None:
                stream.outbox.flush()
        self._streams.clear()

    def _drop(self, stream: RequestStream) -> bool:
        """Abort the choices of `stream` still in the engine and forget them; whether any was."""
        live = [r for r in stream.choice_ids if self._streams.get(r) is stream]
        for request_id in live:
            del self._streams[request_id]
            self._engine.abort(request_id)
        return bool(live)


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
