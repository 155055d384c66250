"""A separate router's worker table, fed watch events by hand on a fake clock: READY keeps its
meaning (a worker the controller stops calling READY is dropped with that one event), a stale
table is served for a bounded time and reported, then nothing is served, naming why."""

import pytest
from intentserve.controller.router.table import Readiness
from intentserve.controller.router.watched import (
    EntryState,
    Freshness,
    TableEntry,
    TableUpdate,
    WatchedTable,
)
from intentserve.policy import Reason, ReasonCode

CONTROLLER = "controller.example:50052"
READY = Readiness(True, Reason(ReasonCode.READY, "2 of 2 verified"))


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def entry(worker_id, revision, state=EntryState.READY):
    return TableEntry(worker_id, f"{worker_id}:1", state, 4, revision)


def update(revision, *workers, snapshot=False, readiness=READY, removed=()):
    return TableUpdate(revision, snapshot, workers, removed, readiness, keepalive_s=1.0)


def fed(max_stale_s=30.0):
    clock = Clock()
    table = WatchedTable(CONTROLLER, max_stale_s=max_stale_s, clock=clock)
    table.apply(update(2, entry("w0", 1), entry("w1", 2), snapshot=True))
    return table, clock


def routed(table):
    return [r.worker_id for r in table.routes()]


def test_nothing_is_routed_before_the_first_table():
    table = WatchedTable(CONTROLLER)
    assert routed(table) == [] and not table.readiness().ready
    table.lost_contact("UNAVAILABLE: connection refused")
    reason = table.readiness().reason
    assert reason.code is ReasonCode.CONTROLLER_UNREACHABLE
    assert CONTROLLER in reason.message and "connection refused" in reason.message


def test_a_workers_verdict_flips_and_the_next_event_drops_it():
    table, _ = fed()
    assert routed(table) == ["w0", "w1"] and table.try_acquire("w0", 4)
    assert table.apply(update(3, entry("w0", 3, EntryState.OUT))) == ()
    assert routed(table) == ["w1"]
    assert not table.try_acquire("w0", 4)  # no new request; the one in flight may end
    assert table.apply(update(4, entry("w0", 4, EntryState.LOST))) == ("w0",)
    table.apply(update(5, removed=("w1",)))
    assert routed(table) == []


def test_the_controllers_not_ready_verdict_routes_nothing():
    table, _ = fed()
    pending = Readiness(False, Reason(ReasonCode.NOT_ENOUGH_REPLICAS, "1 of 2 verified"))
    table.apply(update(3, readiness=pending))
    assert routed(table) == [] and table.readiness() == pending


@pytest.mark.parametrize("silent", ["broken", "keepalives-missed"])
def test_a_stale_table_is_served_and_reported_until_the_bound_then_nothing(silent):
    table, clock = fed(max_stale_s=30.0)
    if silent == "broken":
        table.lost_contact("UNAVAILABLE: connection refused")
    clock.now_s += 5.0
    status = table.status()
    assert status.freshness is Freshness.STALE and status.stale_for_s == pytest.approx(5.0)
    assert table.readiness() == READY and routed(table) == ["w0", "w1"]
    clock.now_s += 25.5  # 30.5 s silent: past the bound
    assert table.status().freshness is Freshness.EXPIRED
    readiness = table.readiness()
    assert not readiness.ready and readiness.reason.code is ReasonCode.CONTROLLER_UNREACHABLE
    assert f"controller at {CONTROLLER} has not been heard from for 30.5 s" in (
        readiness.reason.message
    )
    assert "30 s at most (spec.router.maxStaleS)" in readiness.reason.message
    assert routed(table) == [] and not table.try_acquire("w0", 4)
    table.apply(update(3, entry("w0", 1), entry("w1", 2), snapshot=True))  # back
    assert table.status().freshness is Freshness.FRESH and routed(table) == ["w0", "w1"]


def test_keepalives_keep_it_fresh():
    table, clock = fed()
    for _ in range(10):
        clock.now_s += 1.0
        table.apply(update(2))
    assert table.status().freshness is Freshness.FRESH


def test_a_suspect_is_skipped_until_the_controller_speaks_of_it_again():
    table, _ = fed()
    why = Reason(ReasonCode.WORKER_NOT_SERVING, "a stream broke")
    assert not table.suspect("w0", "elsewhere:1", why)  # another incarnation's address
    assert table.suspect("w0", "w0:1", why) and not table.suspect("w0", "w0:1", why)
    assert routed(table) == ["w1"]
    table.apply(update(3))  # a keepalive says nothing of w0
    assert routed(table) == ["w1"]
    table.apply(update(4, entry("w0", 4)))  # the controller re-verified it
    assert routed(table) == ["w0", "w1"]


def test_requests_are_counted_per_worker_up_to_the_limit():
    table, _ = fed()
    assert table.try_acquire("w1", 2) and table.try_acquire("w1", 2)
    assert not table.try_acquire("w1", 2)
    assert {r.worker_id: r.num_outstanding for r in table.routes()} == {"w0": 0, "w1": 2}
    table.release("w1")
    assert table.try_acquire("w1", 2)


def test_a_request_of_n_choices_counts_n_and_takes_all_or_none():
    table, _ = fed()
    assert table.try_acquire("w1", 4, 3)
    assert not table.try_acquire("w1", 4, 2)  # 3 + 2 > 4: none taken
    assert table.try_acquire("w1", 4, 1)
    table.release("w1", 3)
    assert {r.worker_id: r.num_outstanding for r in table.routes()} == {"w0": 0, "w1": 1}


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match=r"max_stale_s: 0; allowed: seconds > 0"):
        WatchedTable(CONTROLLER, max_stale_s=0)


def test_a_worker_left_out_of_a_new_controllers_table_keeps_its_channel_while_streams_run():
    """A restarted controller's first table lacks the workers it has yet to adopt: nothing new
    is routed to them, but the streams this router has on them run on (their channel stays)."""
    table, _ = fed()
    assert table.try_acquire("w0", 4) and table.try_acquire("w0", 4)
    table.apply(update(1, entry("w1", 1), snapshot=True))  # a new controller: w0 not yet back
    assert routed(table) == ["w1"]
    assert table.addresses() == {"w0:1", "w1:1"}
    table.release("w0")
    assert table.addresses() == {"w0:1", "w1:1"}
    table.release("w0")  # its last stream ended: its channel can go
    assert table.addresses() == {"w1:1"}


def test_a_worker_removed_with_no_streams_here_loses_its_channel():
    table, _ = fed()
    table.apply(update(3, removed=("w0",)))
    assert table.addresses() == {"w1:1"}
