"""One request's stream of outputs, as its caller reads them from another thread than the
engine loop's, and the errors that end a stream early.

    for output in stream:  # RequestOutput deltas; the last one has finished=True
        ...

Or many requests' outputs through one `Outbox`, a list per engine step (the multiplexed stream
to the controller sends each list as one message):

    for batch in outbox:  # [(key, RequestOutput | BaseException), ...]
        ...
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable

from intentserve.common.streaming import END, HandOver
from intentserve.worker.engine.request import RequestOutput
from intentserve.worker.sched.sequence import FinishReason


class EngineLoopClosedError(RuntimeError):
    """The loop was closed: no new requests, and in-flight streams end with this error."""


class RequestFailedError(RuntimeError):
    """One request failed alone in the engine (its sampling, stop checks, its logits); the
    message says where. Its batch mates were not affected."""

    def __init__(self, request_id: str, cause: str) -> None:
        super().__init__(f"request {request_id!r} failed: {cause}")
        self.request_id = request_id


class Outbox:
    """The deliveries of many requests, grouped: `add` on the loop thread collects, `flush`
    (once per step) hands the group to the reader as one list.

    An item is a RequestOutput (the last one has finished=True) or the exception that ended
    the request; nothing follows either end for that key.
    """

    def __init__(self) -> None:
        self._batches: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[tuple[int, object]] = []  # NOTE: loop thread only

    def add(self, key: int, item: object) -> None:
        """Loop thread: one item for the next flush."""
        self._pending.append((key, item))

    def flush(self) -> None:
        """Loop thread: send what was added since the last flush as one batch."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._batches.put(batch)

    def put_now(self, key: int, item: object) -> None:
        """Any thread: one item, sent at once as a batch of its own (a refusal before the
        request reached the loop)."""
        self._batches.put([(key, item)])

    def close(self) -> None:
        """Any thread: wake the reader with an empty batch, so it can see the outbox is done."""
        self._batches.put([])

    def get(self, timeout_s: float | None = None) -> list[tuple[int, object]] | None:
        """The next batch and every batch already waiting behind it, joined; None on timeout."""
        try:
            batch = self._batches.get(timeout=timeout_s)
        except queue.Empty:
            return None
        while True:
            try:
                batch = batch + self._batches.get_nowait()
            except queue.Empty:
                return batch


class RequestStream(HandOver):
    """The RequestOutput deltas of one request, in order; ends after the finished output.

    Iterating raises the engine's error if a step failed while the request was in flight.

    With a stream interval of n, the first output goes out at once (the time to the first
    token is unchanged) and the rest n tokens at a time: an output with fewer waits, joined
    with the next ones, until the request's tokens since the last delivery reach n or it ends
    (finished, aborted or failed), which delivers whatever is held. Each delivery is a message
    through the worker's call, the controller and the client, so a larger n divides the served
    path's per-token cost by about n, at the price of a chunkier stream.
    """

    def __init__(
        self,
        request_id: str,
        cancel: Callable[[RequestStream], None],
        outbox: Outbox | None = None,
        key: int = 0,
        *,
        stream_interval: int = 1,
    ) -> None:
        """With `outbox`, items go there under `key` instead of to this stream's iterator."""
        self.request_id = request_id
        self._cancel = cancel
        self.outbox = outbox
        self.key = key
        super().__init__()
        self.finished = False  # set by the loop once the last item is queued
        self._num_prompt_tokens = 0
        self._num_output_tokens = 0
        self._stream_interval = stream_interval
        self._held: RequestOutput | None = None  # outputs joined, waiting for the interval
        self._delivered_any = False

    def cancel(self) -> None:
        """Abort the request without waiting; the stream then ends with an ABORT output."""
        if not self.finished:
            self._cancel(self)

    # -- called on the loop thread only ------------------------------------------------------

    def _put(self, output: RequestOutput) -> None:
        self._num_prompt_tokens = output.num_prompt_tokens
        self._num_output_tokens = output.num_output_tokens
        if self._held is not None:
            output = _joined(self._held, output)
            self._held = None
        if (
            not output.finished
            and self._delivered_any
            and len(output.new_token_ids) < self._stream_interval
        ):
            self._held = output
            return
        self._delivered_any = True
        if self.outbox is not None:
            self.outbox.add(self.key, output)
            self.finished = output.finished
            return
        self._items.put(output)
        if output.finished:
            self._end()

    def _put_aborted(self) -> None:
        # NOTE: a request aborted before its first step has reported no prompt length yet (0).
        self._put(
            RequestOutput(
                self.request_id,
                (),
                "",
                True,
                FinishReason.ABORT,
                self._num_prompt_tokens,
                self._num_output_tokens,
            )
        )

    # NOTE: `finished` is set before the last item is queued, so a consumer that has seen the
    # end never sends a needless abort from `cancel()`.
    def _fail(self, error: BaseException) -> None:
        self.finished = True
        held, self._held = self._held, None
        if self.outbox is not None:
            if held is not None:
                self.outbox.add(self.key, held)
            self.outbox.add(self.key, error)
            return
        if held is not None:
            self._items.put(held)
        self._items.put(error)

    def _end(self) -> None:
        self.finished = True
        self._items.put(END)


def _joined(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One delta for two consecutive ones: their tokens, text, logprobs and tool calls, the
    later one's state (a first output's prompt logprobs stay with it)."""
    return dataclasses.replace(
        then,
        new_token_ids=first.new_token_ids + then.new_token_ids,
        new_text=first.new_text + then.new_text,
        logprobs=first.logprobs + then.logprobs,
        prompt_logprobs=first.prompt_logprobs + then.prompt_logprobs,
        tool_calls=first.tool_calls + then.tool_calls,
    )
