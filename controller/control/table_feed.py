"""The verified worker table as routers watch it: a snapshot, then each change, by revision.

The reconcile loop publishes the registry's workers and the readiness verdict once per pass
(woken by every registry change, so a verdict that flips reaches the routers in that pass).
A revision counts the table's changes; each worker carries the revision at which it last changed.
Watchers are handlers on the gRPC server's event loop: a publication wakes each on its loop, and
each sends what changed since its own last message (so a slow watcher skips straight to the
newest table), or a keepalive when nothing did within `keepalive_s`. Every message carries the
feed's `controller_id`, drawn when the controller starts: a router tells a restarted controller's
table, PENDING while its workers register again, from a verdict of the one it had (watched.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerRecord
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.policy import Reason, ReasonCode, Verdict

DEFAULT_KEEPALIVE_S = 1.0


@dataclass(frozen=True)
class TableWorker:
    worker_id: str
    address: str
    state: WorkerState
    max_num_seqs: int
    revision: int  # the table revision at which it last changed
    max_model_len: int = 0  # the longest sequence it serves (0 until it reports)
    task: str = "generate"  # what it serves: "generate" or "embed"


@dataclass(frozen=True)
class TableReadiness:
    ready: bool
    state: DeploymentState
    reason: Reason


@dataclass(frozen=True)
class TableEvent:
    """One watch message: the whole table (`snapshot`) or what changed since the last one."""

    revision: int
    snapshot: bool
    workers: tuple[TableWorker, ...]
    removed_worker_ids: tuple[str, ...]
    readiness: TableReadiness
    keepalive_s: float
    controller_id: str


_NOTHING_YET = TableReadiness(
    False, DeploymentState.PENDING, Reason(ReasonCode.WORKER_PENDING, "no verdict published yet")
)


class TableFeed:
    def __init__(self, keepalive_s: float = DEFAULT_KEEPALIVE_S) -> None:
        self.keepalive_s = keepalive_s
        self.controller_id = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._revision = 0
        self._workers: dict[str, TableWorker] = {}
        self._readiness = _NOTHING_YET
        self._watchers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    def publish(self, records: tuple[WorkerRecord, ...], verdict: Verdict) -> int:
        """Take the registry's workers and the verdict; a new revision when anything a router
        routes by changed (not a worker's load). The revision now."""
        readiness = TableReadiness(verdict.ready, deployment_state(verdict), verdict.reason)
        with self._lock:
            revision = self._revision + 1
            workers = {r.worker_id: _worker(r, revision) for r in records}
            for worker_id, worker in workers.items():
                old = self._workers.get(worker_id)
                if old is not None and _same(old, worker):
                    workers[worker_id] = old  # unchanged: keeps its revision
            if workers == self._workers and readiness == self._readiness:
                return self._revision
            self._revision, self._workers, self._readiness = revision, workers, readiness
            watchers = list(self._watchers)
        for loop, wake in watchers:
            with contextlib.suppress(RuntimeError):  # that loop has closed: its watch ended
                loop.call_soon_threadsafe(wake.set)
        return revision

    async def watch(self) -> AsyncIterator[TableEvent]:
        """The table now, then each change (or a keepalive); runs until cancelled."""
        wake = asyncio.Event()
        watcher = (asyncio.get_running_loop(), wake)
        with self._lock:
            self._watchers.add(watcher)
        try:
            sent: dict[str, TableWorker] = {}
            snapshot = True
            while True:
                with self._lock:
                    revision, workers, readiness = self._revision, self._workers, self._readiness
                changed = tuple(w for k, w in workers.items() if sent.get(k) != w)
                removed = tuple(k for k in sent if k not in workers)
                yield TableEvent(
                    revision,
                    snapshot,
                    changed,
                    removed,
                    readiness,
                    self.keepalive_s,
                    self.controller_id,
                )
                sent, snapshot = workers, False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.keepalive_s)
                wake.clear()
        finally:
            with self._lock:
                self._watchers.discard(watcher)


def _worker(record: WorkerRecord, revision: int) -> TableWorker:
    realized = record.realized
    if realized is None:
        return TableWorker(record.worker_id, record.address, record.state, 0, revision)
    return TableWorker(
        record.worker_id,
        record.address,
        record.state,
        realized.max_num_seqs,
        revision,
        realized.max_model_len,
        realized.task,
    )


def _same(a: TableWorker, b: TableWorker) -> bool:
    """Whether nothing a router routes by changed."""
    return _routed_by(a) == _routed_by(b)


def _routed_by(w: TableWorker) -> tuple:
    return (w.address, w.state, w.max_num_seqs, w.max_model_len, w.task)
