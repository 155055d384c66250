"""Errors the controller raises; `intentserve.controller.status_codes` maps each kind to a
gRPC status code.

Messages are written for the operator or client who reads the status detail.
"""

from __future__ import annotations

from intentserve.common.field_errors import FieldError, FieldViolation
from intentserve.policy import Reason


class WrongState(Exception):
    """The call does not fit the worker's state, e.g. a realized report from a lost worker."""


class NotThisRegistration(WrongState):
    """A report or heartbeat whose registration token is not the worker's current one: another
    process (an earlier incarnation, or one holding the same certificate) speaks for it."""


class WorkerAlive(Exception):
    """A registration for an id whose worker is alive (monitored, heartbeating, not suspect):
    it cannot take that worker's place until the worker is gone."""


class DrainRefused(WrongState):
    """A drain would leave fewer verified replicas than min_ready (it can be forced)."""


class UnknownWorker(KeyError):
    """No worker with this id has registered."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.worker_id = worker_id

    def __str__(self) -> str:
        return f"unknown worker {self.worker_id!r}"


class NotReady(Exception):
    """No inference is routed: the deployment is not ready (the verdict's reason says why)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"deployment is not ready: {reason}")
        self.reason = reason


class WrongTask(Exception):
    """The deployment's workers serve another task than the call asks (Generate of an encoder
    deployment, Embed of a decoder one): FAILED_PRECONDITION, naming both."""

    def __init__(self, asked: str, served: str) -> None:
        doors = {"generate": "completions", "embed": "embeddings"}
        super().__init__(
            f"this deployment's model serves {doors.get(served, served)} (task {served}), not "
            f"{doors.get(asked, asked)} (task {asked}); allowed here: task {served} calls only"
        )
        self.asked = asked
        self.served = served


class WorkerUnavailable(Exception):
    """The worker serving a stream went away (lost, stopped, unreachable)."""


class Overloaded(Exception):
    """More load than the deployment takes (RESOURCE_EXHAUSTED)."""


class QueueFull(Overloaded):
    """Every worker slot is taken and the admission queue holds as many requests as it may."""


class QueueTimeout(Exception):
    """A request's deadline, or the longest wait the manifest allows, passed while it waited in
    the admission queue (DEADLINE_EXCEEDED)."""


class UpstreamError(Exception):
    """A worker ended a stream with an error status; it passes through with the same code (and,
    for a refused field, the same google.rpc.BadRequest detail)."""

    def __init__(self, code, message: str, field_violation: FieldViolation | None = None) -> None:
        super().__init__(message)  # code: grpc.StatusCode
        self.code = code
        self.field_violation = field_violation

    @property
    def grpc_code(self):
        """Read by the shared interceptor: the worker's status passes through unchanged."""
        return self.code


class RequestTooLarge(FieldError):
    """A request over a size the router forwards (router/request_size.py: its bytes, turns,
    tools, JSON nesting, characters against max_model_len, a Detokenize's ids), or one whose
    reply is over what the router takes; refused alone, INVALID_ARGUMENT naming the field and
    what is allowed, before a worker renders or tokenizes it."""
