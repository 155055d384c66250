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

A restarted controller's table starts empty and its verdict PENDING until its workers register
again. A table from another controller (another `controller_id`) than the one that verified the
last READY table, with a PENDING verdict, is therefore not a verdict against that table: the
router keeps routing to it (STALE, within `max_stale_s` of the old controller's last word),
leaving out only the workers the new table says are out (rejected, draining, suspect, lost, or
back at another address). The new controller's READY (or FAILED) verdict replaces it.

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
class EntryState(enum.Enum):
    """A worker's state in the controller's table, as far as routing goes."""

    READY = "ready"  # verified: requests go to it
    VERIFYING = "verifying"  # registered or loading: this controller has yet to verify it
    OUT = "out"  # rejected, draining or suspect: nothing new goes to it
    LOST = "lost"  # its process is gone: its streams end


@dataclass(frozen=True)
class TableEntry:
    """One worker of the controller's table, as the watch says it."""

    worker_id: str
    address: str
    state: EntryState
    max_num_seqs: int
    revision: int
    max_model_len: int = 0  # the longest sequence it serves (0 until it reports)
    task: str = "generate"  # what it serves: "generate" or "embed"


@dataclass(frozen=True)
class TableUpdate:
    """One watch event: the whole table (`snapshot`) or what changed."""

    revision: int
    snapshot: bool
    workers: tuple[TableEntry, ...]
    removed_worker_ids: tuple[str, ...]
    readiness: Readiness
    keepalive_s: float
    controller_id: str = ""  # which controller sent it (a new one draws a new id when it starts)
    pending: bool = False  # the verdict is PENDING: waiting for workers (not FAILED)


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
        # The table as the controller last sent it, and which controller sent it.
        self._workers: dict[str, TableEntry] = {}
        self._readiness = Readiness(False, _NO_TABLE)
        self._controller_id = ""
        self._pending = False
        # The READY workers of the last READY table, which controller said so, and when it last
        # did: served while a new controller re-establishes its table.
        self._verified: dict[str, TableEntry] = {}
        self._verified_readiness = self._readiness
        self._verified_by = ""
        self._verified_s = 0.0
        self._outstanding: dict[str, int] = {}
        # NOTE: where this router's requests in flight run, kept while they run even when their
        # worker leaves the table: a restarted controller's first table lacks the workers it has
        # yet to adopt, and closing their channels would cut streams that are serving.
        self._in_flight_at: dict[str, str] = {}  # worker id -> address
        self._suspects: dict[str, TableEntry] = {}  # worker id -> its entry when it became suspect
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
            self._revision = update.revision
            self._readiness = update.readiness
            self._controller_id = update.controller_id
            self._pending = update.pending
            self._keepalive_s = update.keepalive_s
            self._heard_s = self._clock()
            self._broken = None
            if update.readiness.ready:
                self._verified = {
                    k: e for k, e in self._workers.items() if e.state is EntryState.READY
                }
                self._verified_readiness = update.readiness
                self._verified_by, self._verified_s = update.controller_id, self._heard_s
            elif update.controller_id == self._verified_by:
                self._verified = {}  # the controller that verified it no longer says READY
            kept = self._candidates()
            for worker_id, entry in list(self._suspects.items()):
                if kept.get(worker_id) != entry:
                    del self._suspects[worker_id]  # the controller has spoken of it since
            return tuple(e.worker_id for e in update.workers if e.state is EntryState.LOST)

    def lost_contact(self, why: str) -> None:
        """The watch broke (or could not be opened): the table goes stale from its last word."""
        with self._lock:
            self._broken = why

    def status(self) -> TableStatus:
        with self._lock:
            freshness, stale_for_s = self._freshness()
            return TableStatus(
                self.controller,
                self._revision,
                freshness,
                stale_for_s if freshness is not Freshness.FRESH else 0.0,
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
            if freshness is Freshness.EXPIRED:
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
            if self._establishing_s() is None:
                return self._readiness
            verified = self._verified_readiness.reason
            return Readiness(
                True,
                Reason(
                    verified.code,
                    f"{verified.message}; a new controller at {self.controller} re-establishes "
                    f"its table ({self._readiness.reason.message}): this router routes to the "
                    f"last verified one for {self.max_stale_s:g} s at most "
                    "(spec.router.maxStaleS)",
                ),
            )

    def routes(self) -> tuple[Route, ...]:
        with self._lock:
            return tuple(
                Route(
                    k,
                    e.address,
                    e.max_num_seqs,
                    self._outstanding.get(k, 0),
                    max_model_len=e.max_model_len,
                    task=e.task,
                )
                for k, e in sorted(self._routable().items())
            )

    def try_acquire(self, worker_id: str, max_outstanding: int, num: int = 1) -> bool:
        with self._lock:
            entry = self._routable().get(worker_id)
            if entry is None:
                return False
            count = self._outstanding.get(worker_id, 0)
            if count + num > max_outstanding:
                return False
            self._outstanding[worker_id] = count + num
            self._in_flight_at[worker_id] = entry.address
            return True

    def release(self, worker_id: str, num: int = 1) -> None:
        with self._lock:
            count = self._outstanding.get(worker_id, 0) - num
            if count > 0:
                self._outstanding[worker_id] = count
            else:
                self._outstanding.pop(worker_id, None)
                self._in_flight_at.pop(worker_id, None)

    def suspect(self, worker_id: str, address: str, reason: Reason) -> bool:
        with self._lock:
            entry = self._candidates().get(worker_id)
            if entry is None or entry.address != address or worker_id in self._suspects:
                return False
            self._suspects[worker_id] = entry
            return True

    def suspects(self) -> dict[str, str]:
        """The workers suspect here: address -> worker id (their connections are watched)."""
        with self._lock:
            return {e.address: k for k, e in self._suspects.items()}

    def restore(self, worker_id: str) -> None:
        """Its connection answers again: route to it again (while the controller calls it
        READY)."""
        with self._lock:
            self._suspects.pop(worker_id, None)

    def addresses(self) -> set[str]:
        """Every worker's address in the table (and in the verified one while it is served), and
        where requests of this router still run (a channel to any other can go)."""
        with self._lock:
            listed = [*self._workers.values(), *self._candidates().values()]
            return {e.address for e in listed} | set(self._in_flight_at.values())

    def num_outstanding(self) -> int:
        with self._lock:
            return sum(self._outstanding.values())

    def _candidates(self) -> dict[str, TableEntry]:
        """Under the lock: the workers the table may route to, suspect or not: the READY ones
        of the controller's table, and while a new controller re-establishes it, those of the
        last verified table that it says nothing against."""
        ready = {k: e for k, e in self._workers.items() if e.state is EntryState.READY}
        if self._establishing_s() is None:
            return ready
        kept = {k: e for k, e in self._verified.items() if self._not_dropped(k, e)}
        return kept | ready

    def _routable(self) -> dict[str, TableEntry]:
        """Under the lock: the workers requests may go to now."""
        if self._freshness()[0] is Freshness.EXPIRED:
            return {}
        if not self._readiness.ready and self._establishing_s() is None:
            return {}
        return {k: e for k, e in self._candidates().items() if k not in self._suspects}

    def _not_dropped(self, worker_id: str, verified: TableEntry) -> bool:
        """Under the lock: the new controller has not spoken of the worker yet, or is verifying
        the same process (at the same address) again."""
        entry = self._workers.get(worker_id)
        return entry is None or (
            entry.state is EntryState.VERIFYING and entry.address == verified.address
        )

    def _establishing_s(self) -> float | None:
        """Under the lock: while a new controller's PENDING table follows another controller's
        READY one, the seconds since that one last said so (up to `max_stale_s`); else None."""
        if not self._verified or not self._pending or self._readiness.ready:
            return None
        if self._controller_id == self._verified_by:
            return None
        since_s = self._clock() - self._verified_s
        return since_s if since_s <= self.max_stale_s else None

    def _freshness(self) -> tuple[Freshness, float]:
        """Under the lock: fresh, stale or expired, and for how long it has been stale."""
        if self._heard_s is None:  # never heard: nothing to serve from, and nothing stale
            return (Freshness.FRESH, 0.0) if self._broken is None else (Freshness.EXPIRED, 0.0)
        silent_s = self._clock() - self._heard_s
        if self._broken is None and silent_s <= KEEPALIVES_MISSED * self._keepalive_s:
            establishing_s = self._establishing_s()
            if establishing_s is not None:
                return Freshness.STALE, establishing_s
            return Freshness.FRESH, silent_s
        if silent_s <= self.max_stale_s:
            return Freshness.STALE, silent_s
        return Freshness.EXPIRED, silent_s
