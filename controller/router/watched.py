"""A separate router's worker table: the controller's watch events applied, and how long ago the
controller was last heard from.

    table = WatchedTable("controller:50052", max_stale_s=30.0)
    lost = table.apply(update)      # each watch event (a test feeds them by hand)
    table.lost_contact("UNAVAILABLE: connection refused")   # the watch broke

READY keeps its meaning: requests go to the workers the controller last said were READY, and
a worker it no longer says so of is dropped with the event that says it. While the controller is
unreachable (the watch broke, or no message, not even a keepalive, for three keepalives) the
table is STALE: the router keeps serving the last verified table and says so; once the controller
has been silent for `max_stale_s` it is EXPIRED: nothing is routed, readiness is
`controller_unreachable` naming the controller and the bound.

Requests in flight are counted here (this router's own) and keep their worker's channel open
until they end, even when the worker leaves the table (a new controller's first table lacks the
workers it has yet to adopt). A worker whose stream broke is suspect here until its connection
answers this router again or the controller speaks of it again (a new revision of that worker),
whichever comes first.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from intentserve.controller.router.table import Readiness, Route
from intentserve.policy import Reason, ReasonCode

DEFAULT_MAX_STALE_S = 30.0
KEEPALIVES_MISSED = 3  # silent for this many keepalive periods: the controller counts as gone


class Freshness(enum.Enum):
    FRESH = "fresh"
    STALE = "stale"
    EXPIRED = "expired"


@dataclass(frozen=True)
class TableEntry:
    """One worker of the controller's table, as the watch says it."""

    worker_id: str
    address: str
    ready: bool  # READY per the controller's verdict
    lost: bool  # LOST: its process is gone (its streams end)
    max_num_seqs: int
    revision: int


@dataclass(frozen=True)
class TableUpdate:
    """One watch event: the whole table (`snapshot`) or what changed."""

    revision: int
    snapshot: bool
    workers: tuple[TableEntry, ...]
    removed_worker_ids: tuple[str, ...]
    readiness: Readiness
    keepalive_s: float


@dataclass(frozen=True)
class TableStatus:
    controller: str
    revision: int
    freshness: Freshness
    stale_for_s: float
    max_stale_s: float


_NO_TABLE = Reason(ReasonCode.WORKER_PENDING, "no worker table from the controller yet")


class WatchedTable:
    """A `router.table.WorkerTable` fed by the controller's watch."""

    def __init__(
        self,
        controller: str,
        *,
        max_stale_s: float = DEFAULT_MAX_STALE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_stale_s > 0:
            raise ValueError(f"max_stale_s: {max_stale_s!r}; allowed: seconds > 0")
        self.controller = controller
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._lock = threading.Lock()
        self._workers: dict[str, TableEntry] = {}
        self._outstanding: dict[str, int] = {}
        # NOTE: where this router's requests in flight run, kept while they run even when their
        # worker leaves the table: a restarted controller's first table lacks the workers it has
        # yet to adopt, and closing their channels would cut streams that are serving.
        self._in_flight_at: dict[str, str] = {}  # worker id -> address
        self._suspects: dict[str, int] = {}  # worker id -> its revision when it became suspect
        self._readiness = Readiness(False, _NO_TABLE)
        self._revision = 0
        self._keepalive_s = 1.0
        self._heard_s: float | None = None  # when the controller was last heard from
        self._broken: str | None = None  # why the watch is down (None: open)

    def apply(self, update: TableUpdate) -> tuple[str, ...]:
        """Take one watch event; the workers it says were lost (their streams are to end)."""
        with self._lock:
            if update.snapshot:
                self._workers = {}
            for worker_id in update.removed_worker_ids:
                self._workers.pop(worker_id, None)
            for entry in update.workers:
                self._workers[entry.worker_id] = entry
            for worker_id, revision in list(self._suspects.items()):
                entry = self._workers.get(worker_id)
                if entry is None or entry.revision != revision:
                    del self._suspects[worker_id]  # the controller has spoken of it since
            self._revision = update.revision
            self._readiness = update.readiness
            self._keepalive_s = update.keepalive_s
            self._heard_s = self._clock()
            self._broken = None
            return tuple(e.worker_id for e in update.workers if e.lost)

    def lost_contact(self, why: str) -> None:
        """The watch broke (or could not be opened): the table goes stale from its last word."""
        with self._lock:
            self._broken = why

    def status(self) -> TableStatus:
        with self._lock:
            freshness, silent_s = self._freshness()
            return TableStatus(
                self.controller,
                self._revision,
                freshness,
                silent_s if freshness is not Freshness.FRESH else 0.0,
                self.max_stale_s,
            )

    def readiness(self) -> Readiness:
        with self._lock:
            if self._heard_s is None and self._broken is not None:
                return Readiness(
                    False,
                    Reason(
                        ReasonCode.CONTROLLER_UNREACHABLE,
                        f"no worker table from the controller at {self.controller} yet "
                        f"({self._broken})",
                    ),
                )
            freshness, silent_s = self._freshness()
            if freshness is not Freshness.EXPIRED:
                return self._readiness
            why = f" ({self._broken})" if self._broken else ""
            return Readiness(
                False,
                Reason(
                    ReasonCode.CONTROLLER_UNREACHABLE,
                    f"the controller at {self.controller} has not been heard from for "
                    f"{silent_s:.1f} s{why}; a router serves its last worker table for "
                    f"{self.max_stale_s:g} s at most (spec.router.maxStaleS)",
                ),
            )

    def routes(self) -> tuple[Route, ...]:
        with self._lock:
            if self._freshness()[0] is Freshness.EXPIRED or not self._readiness.ready:
                return ()
            return tuple(
                Route(e.worker_id, e.address, e.max_num_seqs, self._outstanding.get(k, 0))
                for k, e in sorted(self._workers.items())
                if e.ready and k not in self._suspects
            )

    def try_acquire(self, worker_id: str, max_outstanding: int) -> bool:
        with self._lock:
            entry = self._workers.get(worker_id)
            if entry is None or not entry.ready or worker_id in self._suspects:
                return False
            if self._freshness()[0] is Freshness.EXPIRED:
                return False
            count = self._outstanding.get(worker_id, 0)
            if count >= max_outstanding:
                return False
            self._outstanding[worker_id] = count + 1
            self._in_flight_at[worker_id] = entry.address
            return True

    def release(self, worker_id: str) -> None:
        with self._lock:
            count = self._outstanding.get(worker_id, 0) - 1
            if count > 0:
                self._outstanding[worker_id] = count
            else:
                self._outstanding.pop(worker_id, None)
                self._in_flight_at.pop(worker_id, None)

    def suspect(self, worker_id: str, address: str, reason: Reason) -> bool:
        with self._lock:
            entry = self._workers.get(worker_id)
            if entry is None or entry.address != address or worker_id in self._suspects:
                return False
            self._suspects[worker_id] = entry.revision
            return True

    def suspects(self) -> dict[str, str]:
        """The workers suspect here: address -> worker id (their connections are watched)."""
        with self._lock:
            return {self._workers[k].address: k for k in self._suspects if k in self._workers}

    def restore(self, worker_id: str) -> None:
        """Its connection answers again: route to it again (while the controller calls it
        READY)."""
        with self._lock:
            self._suspects.pop(worker_id, None)

    def addresses(self) -> set[str]:
        """Every worker's address in the table, and where requests of this router still run (a
        channel to any other can go)."""
        with self._lock:
            return {e.address for e in self._workers.values()} | set(self._in_flight_at.values())

    def num_outstanding(self) -> int:
        with self._lock:
            return sum(self._outstanding.values())

    def _freshness(self) -> tuple[Freshness, float]:
        """Under the lock: fresh, stale or expired, and seconds since the controller spoke."""
        if self._heard_s is None:  # never heard: nothing to serve from, and nothing stale
            return (Freshness.FRESH, 0.0) if self._broken is None else (Freshness.EXPIRED, 0.0)
        silent_s = self._clock() - self._heard_s
        if self._broken is None and silent_s <= KEEPALIVES_MISSED * self._keepalive_s:
            return Freshness.FRESH, silent_s
        if silent_s <= self.max_stale_s:
            return Freshness.STALE, silent_s
        return Freshness.EXPIRED, silent_s
