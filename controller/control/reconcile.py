"""The control loop: observed state is reconciled toward the desired state, every tick.

`reconcile()` is idempotent. Each phase is wrapped so that one failure is logged and counted and
never stops the loop. A change in the registry wakes the loop at once, so health follows a
worker's report (or a worker made suspect by a broken stream or connection) without waiting for
the next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from grpc_health.v1 import health_pb2
from intentserve.controller.control.deployment import Deployment, deployment_state
from intentserve.controller.control.state import WorkerState
from intentserve.controller.control.table_feed import TableFeed
from intentserve.policy import Reason, Verdict

log = logging.getLogger(__name__)

# Workers whose connection is watched: those the router routes to, and those it may again.
_WATCHED = frozenset({WorkerState.READY, WorkerState.SUSPECT})


class Connections(Protocol):
    """The controller's watched connections to the workers (a stream to each that breaks when
    the worker's process or server goes)."""

    def connected(self, address: str) -> bool: ...

    def watch(self, workers: dict[str, str]) -> None: ...

    def prune(self, keep: set[str]) -> None: ...


class StreamEnds(Protocol):
    """What ends the streams to a worker that was lost (the embedded router)."""

    def abort_streams(self, worker_id: str, reason: Reason) -> int: ...


class HealthSink(Protocol):
    """Where the verdict is published as health: grpc_health's sync servicer, or the server's
    publisher that sets the aio server's servicer on its loop."""

    def set(self, service: str, status: int) -> None: ...


@dataclass(frozen=True)
class LoopMetrics:
    num_ticks: int = 0
    last_tick_s: float = 0.0
    max_tick_s: float = 0.0
    total_tick_s: float = 0.0
    num_failures: dict[str, int] = field(default_factory=dict)  # per phase


class Reconciler:
    def __init__(
        self,
        deployment: Deployment,
        connections: Connections,
        streams: StreamEnds,
        health_servicer: HealthSink,
        table_feed: TableFeed,
        *,
        interval_s: float,
        heartbeat_timeout_s: float,
    ) -> None:
        self._deployment = deployment
        self._connections = connections
        self._streams = streams
        self._health = health_servicer
        self._table_feed = table_feed
        self._interval_s = interval_s
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self._verdict: Verdict = deployment.verdict()
        self._metrics = LoopMetrics()
        self._phases: tuple[tuple[str, Callable[[], None]], ...] = (
            ("mark_lost", self._mark_lost),
            ("recheck_suspects", self._recheck_suspects),
            ("publish_verdict", self._publish_verdict),
            ("publish_table", self._publish_table),
            ("watch_connections", self._watch_connections),
        )
        self._health_status: int | None = None
        self._publish_health(self._verdict)

    @property
    def verdict(self) -> Verdict:
        with self._changed:
            return self._verdict

    @property
    def metrics(self) -> LoopMetrics:
        with self._changed:
            return self._metrics

    def wake(self) -> None:
        self._wake.set()

    def reconcile(self) -> Verdict:
        """One pass over every phase; safe to call any number of times."""
        started = time.perf_counter()
        failures = dict(self.metrics.num_failures)
        for name, phase in self._phases:
            try:
                phase()
            except Exception:
                log.exception("reconcile phase %s failed; the loop goes on", name)
                failures[name] = failures.get(name, 0) + 1
        elapsed_s = time.perf_counter() - started
        with self._changed:
            m = self._metrics
            self._metrics = LoopMetrics(
                m.num_ticks + 1,
                elapsed_s,
                max(m.max_tick_s, elapsed_s),
                m.total_tick_s + elapsed_s,
                failures,
            )
            return self._verdict

    def wait_until(self, settled: Callable[[Verdict], bool], timeout_s: float | None) -> Verdict:
        """Block until the published verdict satisfies `settled` or the timeout passes."""
        with self._changed:
            self._changed.wait_for(lambda: settled(self._verdict), timeout_s)
            return self._verdict

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self.reconcile()
            self._wake.wait(self._interval_s)

    def _mark_lost(self) -> None:
        for record in self._deployment.mark_lost(self._heartbeat_timeout_s):
            num_streams = self._streams.abort_streams(record.worker_id, record.problem)
            log.warning(
                "worker %s %s; ended %d streams", record.worker_id, record.problem, num_streams
            )

    def _publish_verdict(self) -> None:
        verdict = self._deployment.verdict()
        with self._changed:
            previous, self._verdict = self._verdict, verdict
            self._changed.notify_all()
        if verdict != previous:
            log.info("deployment %s: %s", deployment_state(verdict).name, verdict.reason)
        self._publish_health(verdict)

    def _publish_table(self) -> None:
        """The routers' watch: the workers and the verdict as this pass saw them."""
        self._table_feed.publish(self._deployment.workers(), self.verdict)

    def _recheck_suspects(self) -> None:
        """A suspect whose connection works again serves again once it has heartbeat since."""
        channels = self._connections
        for record in self._deployment.workers():
            if record.state is not WorkerState.SUSPECT or not channels.connected(record.address):
                continue
            if self._deployment.restore(record.worker_id):
                log.info("worker %s is back: connected and heartbeating", record.worker_id)

    def _publish_health(self, verdict: Verdict) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING  # READY or DEGRADED
            if verdict.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        if status == self._health_status:
            return
        for service in ("", self._deployment.desired.deployment):
            self._health.set(service, status)
        self._health_status = status

    def _watch_connections(self) -> None:
        workers = self._deployment.workers()
        channels = self._connections
        channels.prune({r.address for r in workers})
        channels.watch({r.address: r.worker_id for r in workers if r.state in _WATCHED})
