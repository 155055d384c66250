"""A separate router on loopback: a real controller with scripted workers, and a RouterServer
that learns the verified table from the controller's watch and streams from the workers itself.
READY keeps its meaning (a drained worker is dropped), and while the controller is gone the
router serves its last table, reports it stale, then stops serving naming why; a stream in
flight is not cut when a new controller's first table lacks its worker."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2
from intentserve.client import to_data
from intentserve.controller.cli.render import status_text
from intentserve.controller.router.server import RouterServer
from intentserve.controller.router.settings import RouterConfig
from intentserve.controller.router.table import Readiness
from intentserve.controller.router.watched import EntryState, Freshness, TableEntry, TableUpdate
from intentserve.policy import Reason, ReasonCode, examples
from intentserve.v1 import admin_pb2

from tests.controller.conftest import DEPLOYMENT, Client, eventually
from tests.controller.scripted_worker import Behaviour, ScriptedWorker

pytestmark = pytest.mark.integration
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RE_ESTABLISHING = "worker table stale: ready: fed by hand; a new controller at nowhere:1"


@pytest.fixture
def deployment(start_controller, make_worker):
    """A controller with two verified workers, and a router watching it."""
    # NOTE: a heartbeat timeout well above FAST's: on a loaded machine a scripted worker's
    # heartbeats can lapse for a second, and a lost worker is not what these tests are about.
    server, _ = start_controller(
        paged_attention="on",
        replicas=2,
        min_ready=1,
        max_outstanding_per_worker=8,
        heartbeat_timeout_s=10.0,
    )
    workers = [make_worker(server, f"w{i}", examples.cpu()) for i in range(2)]
    for worker in workers:
        assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    config = RouterConfig(
        DEPLOYMENT, controller=server.address, port=0, http_port=0, max_stale_s=2.0, model="m"
    )
    router = RouterServer(config).start()
    client = Client(router.address)
    eventually(lambda: client.serving(), what="the router SERVING")
    yield server, workers, router, client
    client.channel.close()
    router.stop(grace_s=0)


def served_by(client, n: int = 6) -> set[str]:
    return {r.worker_id for _ in range(n) for r in client.generate(timeout=5) if r.worker_id}


def test_the_router_streams_from_the_workers_the_controller_verified(deployment):
    server, workers, router, client = deployment
    assert served_by(client) == {"w0", "w1"}
    assert sum(w.num_serve_calls for w in workers) == 2  # the router's own calls, one each
    status = client.status()
    assert status.router.freshness == admin_pb2.TABLE_FRESHNESS_FRESH
    assert status.router.revision == server.table_feed.revision
    assert {w.worker_id for w in status.workers} == {"w0", "w1"}
    text = status_text(to_data(status)).splitlines()
    assert text[0] == f"router of deployment {DEPLOYMENT}: READY (2 workers routed to)"
    assert text[2] == (
        f"table: revision {status.router.revision} from the controller at {server.address}, fresh"
    )


def test_a_drained_worker_is_dropped_with_the_next_watch_event(deployment):
    server, _, router, client = deployment
    before = router.table.status().revision
    server.deployment.drain("w0")
    eventually(lambda: router.table.status().revision > before, what="the next event")
    assert [r.worker_id for r in router.table.routes()] == ["w1"]
    assert served_by(client) == {"w1"}


def test_without_the_controller_it_serves_its_last_table_stale_then_stops(deployment):
    server, _, router, client = deployment
    server.stop(grace_s=0)
    status = eventually(
        lambda: (s := client.status()).router.freshness == admin_pb2.TABLE_FRESHNESS_STALE and s,
        what="stale",
    )
    assert status.router.max_stale_s == 2.0 and status.router.controller == server.address
    text = status_text(to_data(status))
    assert "STALE: the last verified table, unconfirmed for" in text
    assert "(a stale table is served for 2 s at most)" in text
    assert client.serving() and served_by(client) == {"w0", "w1"}
    scraped = get(router, "/metrics")[1]
    stale = f'intentserve_router_table_freshness{{deployment="{DEPLOYMENT}",freshness="stale"}} 1.0'
    assert stale in scraped
    code, body = get(router, "/health")
    assert code == 200 and json.loads(body)["state"] == "stale"
    eventually(lambda: client.health_status() == NOT_SERVING, timeout_s=6.0, what="NOT_SERVING")
    with pytest.raises(grpc.RpcError) as refused:
        list(client.generate(timeout=5))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "controller_unreachable" in refused.value.details()
    assert f"the controller at {server.address} has not been heard from" in refused.value.details()
    assert client.status().router.freshness == admin_pb2.TABLE_FRESHNESS_EXPIRED
    code, body = get(router, "/health")
    health = json.loads(body)
    assert code == 503 and health["state"] == "expired"
    assert health["reason"]["code"] == "controller_unreachable"


def get(router, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(router.http_url + path, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_router_refuses_the_controllers_admin_commands_naming_where_they_go(deployment):
    server, _, _, client = deployment
    with pytest.raises(grpc.RpcError) as refused:
        client.admin.Drain(admin_pb2.DrainRequest(worker_id="w0"), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == (
        f"this is a router: it answers status only; drain goes to the controller at "
        f"{server.address}"
    )


def test_a_taken_http_port_is_refused_before_a_grpc_server_is_made(made_aio_servers, taken_port):
    config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0, http_port=taken_port)
    with pytest.raises(RuntimeError, match=f"cannot serve HTTP on 127.0.0.1:{taken_port}"):
        RouterServer(config, watch=False)
    assert made_aio_servers == []


def test_a_router_fed_by_hand_needs_no_controller():
    """What a benchmark does: the table comes from the caller, not a watch."""
    config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0)
    worker = ScriptedWorker("127.0.0.1:9", "w0", examples.cpu())  # never registers
    try:
        with RouterServer(config, watch=False) as router:
            client = Client(router.address)
            assert client.health_status() == NOT_SERVING
            ready = Readiness(True, Reason(ReasonCode.READY, "fed by hand"))
            entry = TableEntry("w0", worker.address, EntryState.READY, 4, 1)
            router.table.apply(TableUpdate(1, True, (entry,), (), ready, keepalive_s=60.0))
            eventually(lambda: client.serving(), what="SERVING")
            assert served_by(client, 2) == {"w0"}
            client.channel.close()
    finally:
        worker.stop()


def test_a_worker_whose_stream_broke_is_suspect_until_its_connection_answers(caplog):
    """The break is this router's alone (the controller is not asked): the worker is skipped
    until the health watch this router then opens to it is answered."""
    caplog.set_level(logging.INFO, logger="intentserve.controller.router.server")
    config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0)
    worker = ScriptedWorker("127.0.0.1:9", "w0", examples.cpu(), behaviour=Behaviour.BREAK)
    try:
        with RouterServer(config, watch=False) as router:
            client = Client(router.address)
            ready = Readiness(True, Reason(ReasonCode.READY, "fed by hand"))
            entry = TableEntry("w0", worker.address, EntryState.READY, 4, 1)
            router.table.apply(TableUpdate(1, True, (entry,), (), ready, keepalive_s=60.0))
            with pytest.raises(grpc.RpcError) as broken:
                list(client.generate(timeout=5))
            assert broken.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "worker w0 is suspect: suspect: a stream broke mid-stream" in caplog.text
            eventually(lambda: [r.worker_id for r in router.table.routes()] == ["w0"], what="back")
            assert "worker w0 answers again: routed to again" in caplog.text
            client.channel.close()
    finally:
        worker.stop()


def test_a_stream_runs_on_when_a_new_controllers_first_table_lacks_its_worker(caplog):
    """A restarted controller's first table holds only the workers registered with it yet: a
    stream on the one missing is not cut, and while that controller's verdict is PENDING new
    requests still go to it (the last verified table); the same controller's PENDING verdict
    routes nothing new."""
    caplog.set_level(logging.INFO, logger="intentserve.controller.router.server")
    config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0)
    worker = ScriptedWorker("127.0.0.1:9", "w0", examples.cpu(), num_tokens=20, token_delay_s=0.05)
    try:
        with RouterServer(config, watch=False) as router:
            client = Client(router.address)
            ready = Readiness(True, Reason(ReasonCode.READY, "fed by hand"))
            entry = TableEntry("w0", worker.address, EntryState.READY, 4, 1)
            router.table.apply(
                TableUpdate(1, True, (entry,), (), ready, keepalive_s=60.0, controller_id="a")
            )
            eventually(lambda: client.serving(), what="SERVING")
            stream = client.generate(max_tokens=20, timeout=10)
            chunks = [next(stream)]
            pending = Readiness(False, Reason(ReasonCode.WORKER_PENDING, "w0 not registered"))
            router.table.lost_contact("UNAVAILABLE: the controller went away")
            eventually(lambda: "worker table stale" in caplog.text, what="the router stale")
            for controller_id in ("b", "a"):  # a new controller, then the one that verified it
                router.table.apply(
                    TableUpdate(
                        1, True, (), (), pending, 60.0, controller_id=controller_id, pending=True
                    )
                )
                if controller_id == "b":
                    assert served_by(client, 1) == {"w0"} and client.health_status() == SERVING
                    eventually(lambda: RE_ESTABLISHING in caplog.text, what="the router saying so")
            eventually(lambda: client.health_status() == NOT_SERVING, what="the tick after it")
            chunks += list(stream)
            assert sum(len(c.token_ids) for c in chunks) == 20 and chunks[-1].finish_reason
            client.channel.close()
    finally:
        worker.stop()


def test_new_requests_go_to_the_last_verified_table_while_a_new_controller_starts(
    start_controller, make_worker
):
    """A real controller restart: the new controller on the same port holds no worker until
    they register again (its verdict PENDING), and the router, watching it, still routes new
    requests to both workers of the last verified table; once they are verified again its
    table is the new controller's, fresh."""
    settings = {"paged_attention": "on", "replicas": 2, "min_ready": 2, "heartbeat_timeout_s": 10}
    server, _ = start_controller(**settings)
    workers = [make_worker(server, f"w{i}", examples.cpu()) for i in range(2)]
    for worker in workers:
        assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    config = RouterConfig(DEPLOYMENT, controller=server.address, port=0, max_stale_s=30.0)
    with RouterServer(config) as router:
        client = Client(router.address)
        eventually(client.serving, what="the router SERVING")
        server.stop(grace_s=0)
        port = int(server.address.rsplit(":", 1)[1])
        again, _ = start_controller(**settings, port=port)
        eventually(lambda: not again.verdict().ready and again.table_feed.revision > 0)
        eventually(
            lambda: router.table.status().revision == again.table_feed.revision,
            what="the router watching the new controller",
        )
        assert served_by(client, 4) == {"w0", "w1"}  # none refused
        assert router.table.status().freshness is Freshness.STALE
        for worker in workers:
            assert eventually(lambda w=worker: _up_again(w), what="registered again").verified
        eventually(lambda: router.table.status().freshness is Freshness.FRESH, what="fresh")
        assert served_by(client, 4) == {"w0", "w1"}
        client.channel.close()


def _up_again(worker: ScriptedWorker):
    """Its verification by the new controller; None while its channel still waits to reconnect
    (it saw the old controller go)."""
    try:
        return worker.up()
    except grpc.RpcError as error:
        if error.code() is grpc.StatusCode.UNAVAILABLE:
            return None
        raise
