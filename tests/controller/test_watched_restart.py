"""A router's table across a controller restart, fed a fake watch stream (the controller's
messages, through the router's protobuf boundary) on a fake clock: while the new controller
re-establishes its table (its verdict PENDING, its workers re-registering), new requests still go
to the last verified table, for `max_stale_s` at most; a worker the new controller's verdict drops
is dropped at once; and the new controller's READY table replaces the old one."""

import pytest
from intentserve.controller.router.convert import table_update_from_pb
from intentserve.controller.router.watched import Freshness, WatchedTable
from intentserve.policy import ReasonCode
from intentserve.v1 import admin_pb2, common_pb2

CONTROLLER = "controller.example:50052"
OLD, NEW = "old-controller", "new-controller"
S = admin_pb2  # the watch's enums
READY_STATE, PENDING_STATE = S.DEPLOYMENT_STATE_READY, S.DEPLOYMENT_STATE_PENDING


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def event(controller_id, revision, *workers, snapshot=False, state=READY_STATE, removed=()):
    """One watch message; `workers`: (worker id, state, address port) each."""
    code = "ready" if state in (READY_STATE, S.DEPLOYMENT_STATE_DEGRADED) else "worker_pending"
    return admin_pb2.WorkerTableEvent(
        controller_id=controller_id,
        revision=revision,
        snapshot=snapshot,
        workers=[
            admin_pb2.TableWorker(
                worker_id=w, address=f"{w}:{port}", state=st, max_num_seqs=4, revision=revision
            )
            for w, st, port in workers
        ],
        removed_worker_ids=removed,
        ready=state in (READY_STATE, S.DEPLOYMENT_STATE_DEGRADED),
        state=state,
        reason=common_pb2.Reason(code=code, message=f"{code} at revision {revision}"),
        keepalive_s=1.0,
    )


def fed(stream, max_stale_s=30.0):
    clock = Clock()
    table = WatchedTable(CONTROLLER, max_stale_s=max_stale_s, clock=clock)
    for message in stream:
        table.apply(table_update_from_pb(message))
    return table, clock


def routed(table):
    return [r.worker_id for r in table.routes()]


RUNNING = event(
    OLD, 7, ("w0", S.WORKER_STATE_READY, 1), ("w1", S.WORKER_STATE_READY, 1), snapshot=True
)


def restarted(*workers, state=PENDING_STATE, max_stale_s=30.0, away_s=2.0):
    """The old controller served, went away for `away_s`, and a new one sent its first table."""
    table, clock = fed([RUNNING], max_stale_s)
    table.lost_contact("UNAVAILABLE: connection refused")
    clock.now_s += away_s
    table.apply(table_update_from_pb(event(NEW, 1, *workers, snapshot=True, state=state)))
    return table, clock


def test_new_requests_go_to_the_last_verified_table_while_the_new_controller_starts():
    table, clock = restarted()  # its first table: no worker has re-registered yet
    assert table.readiness().ready and routed(table) == ["w0", "w1"]
    assert table.try_acquire("w0", 4) and table.try_acquire("w1", 4)
    status = table.status()
    assert status.freshness is Freshness.STALE and status.stale_for_s == pytest.approx(2.0)
    assert "re-establishes its table" in table.readiness().reason.message
    # w0 re-registers at the same address and is being verified again: still routed.
    clock.now_s += 0.5
    table.apply(
        table_update_from_pb(event(NEW, 2, ("w0", S.WORKER_STATE_LOADING, 1), state=PENDING_STATE))
    )
    assert routed(table) == ["w0", "w1"]
    # The new controller verifies w0 and w1 and says READY: its table replaces the old one.
    clock.now_s += 0.5
    table.apply(
        table_update_from_pb(
            event(NEW, 3, ("w0", S.WORKER_STATE_READY, 1), ("w1", S.WORKER_STATE_READY, 1))
        )
    )
    assert routed(table) == ["w0", "w1"] and table.status().freshness is Freshness.FRESH
    assert table.readiness().reason.message == "ready at revision 3"


@pytest.mark.parametrize(
    "state",
    [S.WORKER_STATE_REJECTED, S.WORKER_STATE_LOST, S.WORKER_STATE_DRAINING, S.WORKER_STATE_SUSPECT],
)
def test_a_worker_the_new_controller_drops_is_dropped_at_once(state):
    table, _ = restarted(("w1", state, 1))
    assert routed(table) == ["w0"]
    assert not table.try_acquire("w1", 4)


def test_a_worker_back_at_another_address_waits_for_the_new_verdict():
    """Another address is another process (Ray restarted it): not the one verified before."""
    table, _ = restarted(("w1", S.WORKER_STATE_REGISTERED, 2))
    assert routed(table) == ["w0"]


def test_the_old_table_is_served_for_max_stale_s_at_most():
    table, clock = restarted(max_stale_s=5.0, away_s=2.0)
    assert routed(table) == ["w0", "w1"]
    clock.now_s += 3.5  # 5.5 s since the old controller last spoke; the new one keeps talking
    table.apply(table_update_from_pb(event(NEW, 1, state=PENDING_STATE)))
    assert routed(table) == [] and not table.try_acquire("w0", 4)
    readiness = table.readiness()
    assert not readiness.ready and readiness.reason.code is ReasonCode.WORKER_PENDING
    assert table.status().freshness is Freshness.FRESH  # the new controller is heard; its verdict


def test_a_failed_verdict_of_the_new_controller_is_a_verdict():
    table, _ = restarted(("w1", S.WORKER_STATE_REJECTED, 1), state=S.DEPLOYMENT_STATE_FAILED)
    assert routed(table) == [] and not table.readiness().ready


def test_the_same_controllers_pending_verdict_routes_nothing():
    """Only a new controller is given time: the one that verified the table is believed."""
    table, _ = fed([RUNNING, event(OLD, 8, ("w1", S.WORKER_STATE_LOADING, 1), state=PENDING_STATE)])
    assert routed(table) == [] and not table.readiness().ready


def test_a_suspect_absent_from_the_new_table_stays_suspect():
    table, _ = fed([RUNNING])
    assert table.suspect("w0", "w0:1", table.readiness().reason)
    table.lost_contact("UNAVAILABLE: connection refused")
    table.apply(table_update_from_pb(event(NEW, 1, snapshot=True, state=PENDING_STATE)))
    assert routed(table) == ["w1"]


def test_the_old_tables_addresses_keep_their_channels_while_it_is_served():
    table, clock = restarted(max_stale_s=5.0)
    assert table.addresses() == {"w0:1", "w1:1"}
    clock.now_s += 10.0
    assert table.addresses() == set()
