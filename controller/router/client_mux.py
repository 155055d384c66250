"""The controller's side of `Inference.GenerateMany`: many requests of one client on one call.

    async for events in ClientStreams(router, context).serve(commands):  # GenerateEvents
        yield events

Each start command is routed as its own Generate call would be (`router.agenerate` in a task of
the server's loop: admission, the worker's choice, the metrics, the worker's deadline); its
responses become output events and its failure one error event with the status that call would
have ended with. Events produced while the previous message was being written leave together:
the requests served by one worker step (delivered on the loop in one go, worker_mux.py) cross to
the client in one message, not one message per token. A cancel command, and the end of the call,
cancel the request's task, whose `finally` cancels the worker's request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator

import grpc
from google.protobuf import any_pb2
from intentserve.common.status import fit_status_message, lookup, status_details
from intentserve.controller.status_codes import STATUS_CODES
from intentserve.v1 import inference_pb2

log = logging.getLogger(__name__)


class RequestCall:
    """The router's view of one request on the call (what it reads of a
    grpc.aio.ServicerContext): its own deadline, which the controller enforces (`deadline()`,
    entered around the request's routing), the code that deadline ended it with, and cancelled
    by `cancel()`. Made on the call's loop."""

    def __init__(self, timeout_s: float | None) -> None:
        self._deadline = asyncio.timeout(timeout_s)  # None: no deadline
        self._cancelled = False

    def deadline(self) -> asyncio.Timeout:
        """The request's deadline: entered around its routing, it cancels the task when due."""
        return self._deadline

    def time_remaining(self) -> float | None:
        when = self._deadline.when()
        if when is None:
            return None
        return max(0.0, when - asyncio.get_running_loop().time())

    def code(self) -> grpc.StatusCode | None:
        """DEADLINE_EXCEEDED once the deadline's timer has ended the request (a fact, whatever
        a clock reads then: a loop's timer may fire a hair before its time by any other clock);
        None before, as grpc's is while no code is set."""
        return grpc.StatusCode.DEADLINE_EXCEEDED if self._deadline.expired() else None

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True


class ClientStreams:
    """One GenerateMany call: its requests' tasks by key, and the events waiting to be sent."""

    # NOTE: a client that writes commands and never reads would otherwise make the controller
    # hold a task and an event per command (each refusal is one) without end: while this many
    # requests run or events wait, its commands wait unread, and grpc's flow control holds its
    # writes.
    MAX_PENDING_EVENTS = 4096

    def __init__(self, router) -> None:
        """`router`: anything with `agenerate(request, context)` (the server passes the
        metered one)."""
        self._router = router
        self._tasks: dict[int, tuple[asyncio.Task, RequestCall]] = {}
        self._pending: list[inference_pb2.GenerateEvent] = []
        self._news = asyncio.Event()
        self._room = asyncio.Event()  # set while below MAX_PENDING_EVENTS (requests + events)
        self._room.set()
        self._commands_ended = False
        self._failure: Exception | None = None  # a command that did not parse ends the call

    async def serve(self, commands: AsyncIterator) -> AsyncIterator[inference_pb2.GenerateEvents]:
        """The call's messages out, while `commands` come in; ends when the client has closed
        its side and every request has ended."""
        reader = asyncio.get_running_loop().create_task(self._read(commands))
        try:
            while True:
                await self._news.wait()
                self._news.clear()
                if self._failure is not None:
                    raise self._failure
                if self._pending:
                    events, self._pending = self._pending, []
                    self._check_room()
                    yield inference_pb2.GenerateEvents(events=events)
                if self._commands_ended and not self._tasks and not self._pending:
                    return
        finally:
            reader.cancel()
            for task, call in list(self._tasks.values()):
                call.cancel()
                task.cancel()

    async def _read(self, commands: AsyncIterator) -> None:
        try:
            async for command in commands:
                if command.WhichOneof("command") != "cancel":  # a cancel always goes through
                    self._check_room()
                    await self._room.wait()
                self._command(command)
        except Exception as error:  # a malformed command: the call ends with its status
            self._failure = error
        finally:
            self._commands_ended = True
            self._news.set()

    def _command(self, command: inference_pb2.GenerateCommand) -> None:
        key, kind = command.stream, command.WhichOneof("command")
        if kind == "cancel":
            task_call = self._tasks.pop(key, None)
            if task_call is not None:
                task_call[1].cancel()
                task_call[0].cancel()
            return
        if kind is None:
            self._fail(key, grpc.StatusCode.INVALID_ARGUMENT, "command: set start or cancel")
        elif key in self._tasks:
            self._fail(key, grpc.StatusCode.INVALID_ARGUMENT, f"stream: key {key} is in use")
        elif not (math.isfinite(command.timeout_s) and command.timeout_s >= 0):
            message = f"timeout_s: {command.timeout_s}; allowed: finite seconds >= 0 (0: none)"
            self._fail(key, grpc.StatusCode.INVALID_ARGUMENT, message)
        else:
            call = RequestCall(command.timeout_s or None)
            task = asyncio.get_running_loop().create_task(self._run(key, command.start, call))
            self._tasks[key] = (task, call)

    async def _run(
        self, key: int, request: inference_pb2.GenerateRequest, call: RequestCall
    ) -> None:
        finished = False
        try:
            async with (
                call.deadline(),
                contextlib.aclosing(self._router.agenerate(request, call)) as responses,
            ):
                async for response in responses:
                    finished = bool(response.finish_reason)
                    self._emit(inference_pb2.GenerateEvent(stream=key, output=response))
            if not finished:  # the router returned early: the deadline passed upstream
                self._fail(key, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        except TimeoutError:
            self._fail(key, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        except asyncio.CancelledError:
            raise  # a cancel command or the call's end: nobody to tell
        except Exception as error:  # the router's refusal or the worker's failure
            code, details = lookup(STATUS_CODES, error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("request %s on a multiplexed call failed", request.request_id)
            self._fail(key, code, details, status_details(error))
        finally:
            if self._tasks.get(key, (None,))[0] is asyncio.current_task():
                del self._tasks[key]
            self._check_room()
            self._news.set()

    def _fail(
        self,
        key: int,
        code: grpc.StatusCode,
        details: str,
        rich_details: list[any_pb2.Any] | None = None,
    ) -> None:
        error = inference_pb2.GenerateError(
            code=code.value[0],
            details=fit_status_message(details),
            status_details=rich_details or [],
        )
        self._emit(inference_pb2.GenerateEvent(stream=key, error=error))

    def _emit(self, event: inference_pb2.GenerateEvent) -> None:
        self._pending.append(event)
        self._news.set()

    def _check_room(self) -> None:
        """The reader checks before each start; what drains requests or events checks again,
        to wake it."""
        if len(self._tasks) + len(self._pending) < self.MAX_PENDING_EVENTS:
            self._room.set()
        else:
            self._room.clear()
