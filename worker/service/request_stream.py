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
from dataclasses import dataclass

from intentserve.common.choices import choice_id
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
    """The RequestOutput deltas of one request's choices (`n`, one by default), in order for
    each choice, tagged with its index and named by the request's id; it ends after every
    choice's finished output.

    Iterating raises the engine's error if a step failed while the request was in flight, or
    one of its choices failed (the others are aborted then: a request fails whole).

    With a stream interval of n, each choice's first output goes out at once (the time to the
    first token is unchanged) and the rest n tokens at a time: an output with fewer waits,
    joined with the next ones, until the choice's tokens since the last delivery reach n or it
    ends (finished, aborted or failed), which delivers whatever is held. Each delivery is a
    message through the worker's call, the controller and the client, so a larger n divides the
    served path's per-token cost by about n, at the price of a chunkier stream.
    """

    def __init__(
        self,
        request_id: str,
        cancel: Callable[[RequestStream], None],
        outbox: Outbox | None = None,
        key: int = 0,
        *,
        stream_interval: int = 1,
        num_choices: int = 1,
    ) -> None:
        """With `outbox`, items go there under `key` instead of to this stream's iterator."""
        self.request_id = request_id
        self._cancel = cancel
        self.outbox = outbox
        self.key = key
        super().__init__()
        self.finished = False  # set by the loop once the last item is queued
        self._stream_interval = stream_interval
        self._choices = [_Choice(choice_id(request_id, i)) for i in range(num_choices)]

    @property
    def choice_ids(self) -> tuple[str, ...]:
        """The engine's ids of the request's choices, by index."""
        return tuple(choice.request_id for choice in self._choices)

    def cancel(self) -> None:
        """Abort the request without waiting; the stream then ends with an ABORT output for
        each choice still running."""
        if not self.finished:
            self._cancel(self)

    # -- called on the loop thread only ------------------------------------------------------

    def _put(self, output: RequestOutput) -> None:
        choice = self._choices[output.index]
        if self.finished or choice.finished:
            return
        output = dataclasses.replace(output, request_id=self.request_id)
        choice.num_prompt_tokens = output.num_prompt_tokens
        choice.num_output_tokens = output.num_output_tokens
        if choice.held is not None:
            output = _joined(choice.held, output)
            choice.held = None
        if (
            not output.finished
            and choice.delivered_any
            and len(output.new_token_ids) < self._stream_interval
        ):
            choice.held = output
            return
        choice.delivered_any = True
        choice.finished = output.finished
        done = all(c.finished for c in self._choices)
        if self.outbox is not None:
            self.outbox.add(self.key, output)
            self.finished = done
            return
        self._items.put(output)
        if done:
            self._end()

    def _put_aborted(self) -> None:
        """An ABORT output for each choice still running (with what it held back)."""
        # NOTE: a request aborted before its first step has reported no prompt length yet (0).
        for index, choice in enumerate(self._choices):
            if not choice.finished:
                self._put(
                    RequestOutput(
                        self.request_id,
                        (),
                        "",
                        True,
                        FinishReason.ABORT,
                        choice.num_prompt_tokens,
                        choice.num_output_tokens,
                        index=index,
                    )
                )

    # NOTE: `finished` is set before the last item is queued, so a consumer that has seen the
    # end never sends a needless abort from `cancel()`.
    def _fail(self, error: BaseException) -> None:
        if self.finished:
            return
        self.finished = True
        held = [c.held for c in self._choices if c.held is not None]
        for choice in self._choices:
            choice.held = None
        if self.outbox is not None:
            for output in held:
                self.outbox.add(self.key, output)
            self.outbox.add(self.key, error)
            return
        for output in held:
            self._items.put(output)
        self._items.put(error)

    def _end(self) -> None:
        self.finished = True
        self._items.put(END)


@dataclass
class _Choice:
    """One choice's place in its request's stream."""

    request_id: str  # the engine's
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    held: RequestOutput | None = None  # outputs joined, waiting for the interval
    delivered_any: bool = False
    finished: bool = False


def _joined(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One delta for two consecutive ones: their tokens, text, logprobs and tool calls, the
    later one's state (a first output's prompt logprobs stay with it)."""
    return dataclasses.replace(
        then,
        new_token_ids=first.new_token_ids + then.new_token_ids,
        new_text=first.new_text + then.new_text,
        new_reasoning=first.new_reasoning + then.new_reasoning,
        logprobs=first.logprobs + then.logprobs,
        prompt_logprobs=first.prompt_logprobs + then.prompt_logprobs,
        tool_calls=first.tool_calls + then.tool_calls,
    )
