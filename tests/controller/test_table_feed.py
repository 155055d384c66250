"""The routers' watch of the worker table, on the controller's side (no gRPC): a snapshot first,
then each change with its revision, keepalives while nothing changes, and no new revision for
what routers do not route by (a worker's load)."""

import asyncio
from dataclasses import replace

from intentserve.controller.control.convert import table_event_to_pb
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.controller.control.table_feed import TableFeed
from intentserve.controller.router.convert import table_update_from_pb
from intentserve.controller.router.watched import WatchedTable
from intentserve.policy import examples

from tests.controller.scripted_worker import realized_for
from tests.controller.test_deployment import make, up


def publish(feed, deployment):
    return feed.publish(deployment.workers(), deployment.verdict())


async def take(events, n):
    return [await anext(events) for _ in range(n)]


def test_a_snapshot_then_each_change_then_keepalives():
    deployment, _, _ = make("on", min_ready=1, replicas=2)
    feed = TableFeed(keepalive_s=0.05)
    up(deployment, "w0")
    assert publish(feed, deployment) == 1

    async def watch():
        events = feed.watch()
        (snapshot,) = await take(events, 1)
        assert snapshot.snapshot and snapshot.revision == 1
        assert [(w.worker_id, w.state, w.revision) for w in snapshot.workers] == [
            ("w0", WorkerState.READY, 1)
        ]
        assert snapshot.readiness.ready and snapshot.readiness.state is DeploymentState.READY
        # The verdict on w0 flips: the next message says so, at the next revision.
        deployment.drain("w0", force=True)
        assert publish(feed, deployment) == 2
        (change,) = await take(events, 1)
        assert not change.snapshot and change.revision == 2
        assert [(w.worker_id, w.state, w.revision) for w in change.workers] == [
            ("w0", WorkerState.DRAINING, 2)
        ]
        assert not change.readiness.ready
        # Nothing changes: a keepalive at the same revision, with nothing in it.
        (keepalive,) = await take(events, 1)
        assert (keepalive.revision, keepalive.workers, keepalive.removed_worker_ids) == (2, (), ())
        await events.aclose()

    asyncio.run(watch())


def test_a_workers_load_is_no_change_and_an_unchanged_worker_keeps_its_revision():
    deployment, _, _ = make("on", min_ready=1, replicas=2)
    feed = TableFeed()
    up(deployment, "w0")
    assert publish(feed, deployment) == 1
    deployment.heartbeat("w0", WorkerLoad(num_running=3))
    assert deployment.registry.try_acquire("w0", 10)
    assert publish(feed, deployment) == 1  # load and outstanding requests are not routed by
    up(deployment, "w1")
    assert publish(feed, deployment) == 2

    async def watch():
        events = feed.watch()
        (snapshot,) = await take(events, 1)
        await events.aclose()
        return {w.worker_id: w.revision for w in snapshot.workers}

    assert asyncio.run(watch()) == {"w0": 1, "w1": 2}


def test_each_controller_sends_an_id_of_its_own():
    """A router tells a restarted controller's table (being re-established) from a verdict of
    the controller that verified its table by this id."""
    deployment, _, _ = make("on", min_ready=1, replicas=2)
    first, second = TableFeed(), TableFeed()

    async def ids(feed):
        events = feed.watch()
        taken = await take(events, 1)
        await events.aclose()
        return {e.controller_id for e in taken}

    publish(first, deployment)
    (first_id,) = asyncio.run(ids(first))
    assert len(first_id) >= 16 and asyncio.run(ids(first)) == {first_id}
    assert asyncio.run(ids(second)) != {first_id}


def test_a_separate_router_learns_each_workers_max_model_len_from_the_watch():
    """What a router checks a request's characters and ids against (request_size.py)."""
    deployment, _, _ = make("on", min_ready=1)
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    realized = realized_for(deployment.desired.policy, resolution, examples.cpu().model)
    deployment.report_realized("w0", replace(realized, max_model_len=64), None)
    feed = TableFeed()
    publish(feed, deployment)

    async def first():
        events = feed.watch()
        (event,) = await take(events, 1)
        await events.aclose()
        return event

    table = WatchedTable("controller.example:50052")
    table.apply(table_update_from_pb(table_event_to_pb(asyncio.run(first()))))
    assert [(r.worker_id, r.max_model_len) for r in table.routes()] == [("w0", 64)]
