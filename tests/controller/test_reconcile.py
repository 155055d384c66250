"""The reconcile loop: idempotent passes, LOST detection, suspects re-checked, health follows the
verdict, and a failing phase never stops the loop."""

import threading

from grpc_health.v1 import health, health_pb2
from intentserve.controller.control.reconcile import Reconciler
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import WorkerState
from intentserve.controller.control.table_feed import TableFeed
from intentserve.controller.embedded import EmbeddedTable
from intentserve.controller.router.routing import Router
from intentserve.policy import Reason, ReasonCode

from tests.controller.conftest import WAITS, eventually
from tests.controller.test_deployment import TIMEOUT_S, make, up

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class FakeChannels:
    """What the loop asks of the router's channels, with no network: which workers it watches,
    and whether a watch is answered (`up`)."""

    def __init__(self) -> None:
        self.watched: dict[str, str] = {}
        self.up: set[str] = set()

    def watch(self, workers: dict[str, str]) -> None:
        self.watched = dict(workers)

    def prune(self, keep: set[str]) -> None:
        self.up &= keep

    def connected(self, address: str) -> bool:
        return address in self.up

    def close(self) -> None:
        self.up.clear()


class SpyRouter(Router):
    def __init__(self, deployment) -> None:
        super().__init__(
            EmbeddedTable(deployment), max_outstanding_per_worker=1, queue_wait_times=WAITS
        )
        self.channels = FakeChannels()
        self.aborted: list[str] = []

    def abort_streams(self, worker_id, reason):
        self.aborted.append(worker_id)
        return super().abort_streams(worker_id, reason)


def loop(mode="on", interval_s=60.0):
    deployment, clock, _ = make(mode)
    router = SpyRouter(deployment)
    servicer = health.HealthServicer()
    reconciler = Reconciler(
        deployment,
        router.channels,
        router,
        servicer,
        TableFeed(),
        interval_s=interval_s,
        heartbeat_timeout_s=TIMEOUT_S,
    )
    return reconciler, deployment, clock, router, servicer


def health_of(servicer, service=""):
    return servicer.Check(health_pb2.HealthCheckRequest(service=service), None).status


def test_health_follows_the_verdict_for_both_service_names():
    reconciler, deployment, _, _, servicer = loop()
    assert health_of(servicer) == health_of(servicer, "d") == NOT_SERVING
    up(deployment)
    assert reconciler.reconcile().ready
    assert health_of(servicer) == health_of(servicer, "d") == SERVING
    deployment.drain("w0", force=True)
    assert not reconciler.reconcile().ready
    assert health_of(servicer) == health_of(servicer, "d") == NOT_SERVING


def test_reconcile_is_idempotent():
    reconciler, deployment, clock, router, servicer = loop()
    up(deployment)
    first = reconciler.reconcile()
    assert [reconciler.reconcile() for _ in range(3)] == [first] * 3
    assert health_of(servicer) == SERVING and router.aborted == []
    assert reconciler.metrics.num_ticks == 4


def test_a_silent_worker_becomes_lost_its_streams_end_and_health_drops():
    reconciler, deployment, clock, router, servicer = loop()
    up(deployment)
    reconciler.reconcile()
    clock.now_s += TIMEOUT_S * 2
    verdict = reconciler.reconcile()
    assert deployment.registry.get("w0").state is WorkerState.LOST
    assert router.aborted == ["w0"]
    assert not verdict.ready and health_of(servicer) == NOT_SERVING
    reconciler.reconcile()
    assert router.aborted == ["w0"]  # once, not every tick


def test_ready_and_suspect_workers_are_watched_and_a_suspect_comes_back_when_answered():
    reconciler, deployment, clock, router, servicer = loop()
    up(deployment)
    reconciler.reconcile()
    assert router.channels.watched == {"w0:1": "w0"}
    deployment.suspect("w0", "w0:1", Reason(ReasonCode.WORKER_NOT_SERVING, "suspect: broke"))
    assert not reconciler.reconcile().ready and health_of(servicer) == NOT_SERVING
    assert router.channels.watched == {"w0:1": "w0"}  # still watched: that is the re-check
    clock.now_s += 0.1
    deployment.heartbeat("w0", WorkerLoad())
    assert not reconciler.reconcile().ready  # alive, but its connection is not answered yet
    router.channels.up.add("w0:1")
    assert reconciler.reconcile().ready and health_of(servicer) == SERVING
    assert deployment.registry.get("w0").state is WorkerState.READY


def test_a_failing_phase_is_counted_and_the_other_phases_still_run(monkeypatch, caplog):
    reconciler, deployment, _, _, servicer = loop()
    up(deployment)

    def broken(timeout_s):
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(deployment, "mark_lost", broken)
    assert reconciler.reconcile().ready
    assert health_of(servicer) == SERVING
    assert reconciler.metrics.num_failures == {"mark_lost": 1}
    assert "reconcile phase mark_lost failed" in caplog.text


def test_the_background_loop_survives_failures_and_wakes_on_changes(monkeypatch):
    reconciler, deployment, _, _, servicer = loop(interval_s=0.01)
    monkeypatch.setattr(deployment, "mark_lost", lambda timeout_s: 1 / 0)
    reconciler.start()
    try:
        eventually(lambda: reconciler.metrics.num_ticks >= 5, what="five ticks")
        assert reconciler.metrics.num_failures["mark_lost"] >= 4
        up(deployment)
        eventually(lambda: health_of(servicer) == SERVING, what="SERVING")
    finally:
        reconciler.stop()
    metrics = reconciler.metrics
    assert 0 < metrics.last_tick_s <= metrics.max_tick_s <= metrics.total_tick_s


def test_wait_until_returns_the_settled_verdict_or_the_latest_at_the_timeout():
    reconciler, deployment, _, _, _ = loop()
    assert not reconciler.wait_until(lambda v: v.ready, timeout_s=0.01).ready
    up(deployment)
    threading.Timer(0.05, reconciler.reconcile).start()
    assert reconciler.wait_until(lambda v: v.ready, timeout_s=5).ready
