"""What a router's HTTP front end shows of the deployment beyond routing: its readiness as
`/health` says it, and what each worker realized (`/v1/models`). The embedded router's view is
the controller's own verdict and registry (controller/embedded.py); a separate router's, its
watched table (`TableView`), which carries no realized reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from intentserve.controller.router.watched import Freshness, WatchedTable
from intentserve.policy import Reason


@dataclass(frozen=True)
class Health:
    serving: bool  # what gRPC health says: SERVING
    state: str  # a word for people and scripts: ready, degraded, pending, failed, stale, expired
    reason: Reason


@dataclass(frozen=True)
class Realized:
    """One worker's realized state, as /v1/models lists it."""

    max_model_len: int
    labels: dict[str, str]  # worker_id and the realized-info metric's labels


class DeploymentView(Protocol):
    def health(self) -> Health: ...

    def realized(self) -> list[Realized]: ...


class TableView:
    """A separate router's view: readiness from its table, stale or expired said as such."""

    def __init__(self, table: WatchedTable) -> None:
        self._table = table

    def health(self) -> Health:
        readiness = self._table.readiness()
        freshness = self._table.status().freshness
        if freshness is not Freshness.FRESH:
            state = freshness.value
        else:
            state = "ready" if readiness.ready else "pending"
        return Health(readiness.ready, state, readiness.reason)

    def realized(self) -> list[Realized]:
        return []
