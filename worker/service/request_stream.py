"""One request's stream of outputs, as its caller reads them from another thread than the
engine loop's, and the errors that end a stream early.

    for output in stream:  # RequestOutput deltas; the last one has finished=True
        ...
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

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


_END = object()  # queued after a stream's last item


class RequestStream:
    """The RequestOutput deltas of one request, in order; ends after the finished output.

    Iterating raises the engine's error if a step failed while the request was in flight.
    """

    def __init__(self, request_id: str, cancel: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._done = False  # set by the consumer once it has seen the end
        self.finished = False  # set by the loop once the last item is queued
        self._num_prompt_tokens = 0
        self._num_output_tokens = 0

    def __iter__(self) -> Iterator[RequestOutput]:
        return self

    def __next__(self) -> RequestOutput:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def cancel(self) -> None:
        """Abort the request without waiting; the stream then ends with an ABORT output."""
        if not self.finished:
            self._cancel(self.request_id)

    # -- called on the loop thread only ------------------------------------------------------

    def _put(self, output: RequestOutput) -> None:
        self._num_prompt_tokens = output.num_prompt_tokens
        self._num_output_tokens = output.num_output_tokens
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
        self._items.put(error)

    def _end(self) -> None:
        self.finished = True
        self._items.put(_END)
