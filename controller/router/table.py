"""What the router routes by: the verified worker table, as narrow values.

The router never reads the control plane's registry. It asks a `WorkerTable` for the deployment's
readiness, the workers it may route to (READY per the controller's verdict) and their load, and
tells it when a stream to a worker broke. Two tables serve it: the embedded router's, read from
the controller in the same process (controller/embedded.py), and a separate router's, fed by the
controller's watch stream (router/watched.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from intentserve.controller.errors import WrongTask
from intentserve.policy import Reason


@dataclass(frozen=True)
class Readiness:
    """Whether requests are routed at all, and why (the controller's verdict, or the router's
    own reason when it can no longer trust its table)."""

    ready: bool
    reason: Reason


@dataclass(frozen=True)
class Route:
    """One worker the controller verified READY, as the router sends to it."""

    worker_id: str
    address: str  # host:port of its WorkerStreams server
    max_num_seqs: int  # the sequence slots it realized
    num_outstanding: int = 0  # slots this router holds on it: a request's choices, summed
    max_model_len: int = 0  # the longest sequence it serves, in tokens (0: not reported)
    task: str = "generate"  # what it serves: "generate" (Generate) or "embed" (Embed)


GENERATE = "generate"
EMBED = "embed"


def refuse_other_task(routes: tuple[Route, ...], asked: str) -> None:
    """WrongTask when READY workers serve, and none of them `asked`'s task."""
    if routes and not any(r.task == asked for r in routes):
        raise WrongTask(asked, routes[0].task)


def longest_served(routes: tuple[Route, ...]) -> int:
    """The longest sequence any of `routes` serves (0: none reported): what a request that may
    go to any of them has to fit."""
    return max((r.max_model_len for r in routes), default=0)


class WorkerTable(Protocol):
    def readiness(self) -> Readiness: ...

    def routes(self) -> tuple[Route, ...]:
        """The workers requests may go to now, by worker id."""
        ...

    def try_acquire(self, worker_id: str, max_outstanding: int, num: int = 1) -> bool:
        """Count `num` more slots (a request's choices) on the worker unless that would pass
        `max_outstanding` or it is no longer routable."""
        ...

    def release(self, worker_id: str, num: int = 1) -> None: ...

    def suspect(self, worker_id: str, address: str, reason: Reason) -> bool:
        """A stream to the worker at `address`, or its connection, broke: route nothing to it
        until it is known to serve again. Whether it became suspect now."""
        ...
