"""A second process holding a live worker's certificate and key (as code inside that worker
would) cannot displace it: its registration is refused while the worker is alive, its reports and
heartbeats name no registration of theirs, and each attempt is logged with its peer."""

from __future__ import annotations

import dataclasses
import logging

import grpc
import pytest
from intentserve.client import ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.controller.auth import Security
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy import examples
from intentserve.v1 import worker_pb2

from tests.controller.conftest import DEPLOYMENT, FAST, eventually
from tests.controller.scripted_worker import ScriptedWorker

pytestmark = pytest.mark.integration
TOKEN = "operator-token"
TIB = 1 << 40


@pytest.fixture
def deployment():
    """Start a TLS controller of two replicas (`overrides`: its settings); workers are scripted,
    each with its replica's certificate, as `up` hands them out (and an attacker would hold)."""
    servers: list[ControllerServer] = []
    clients: list[ControllerClient] = []
    workers: list[ScriptedWorker] = []

    def start(**overrides):
        ca = DeploymentCa.create(DEPLOYMENT)
        settings = {**FAST, "replicas": 2, "paged_attention": "on", **overrides}
        config = dataclasses.replace(
            ControllerSettings(**settings).config(),
            security=Security(ca.controller_identity(()), frozenset({TOKEN})),
        )
        server = ControllerServer(config).start()
        servers.append(server)
        identities = {i: ca.issue(f"{DEPLOYMENT}-{i}") for i in range(2)}

        def worker(i: int) -> ScriptedWorker:
            workers.append(
                ScriptedWorker(
                    server.registry_address,
                    f"{DEPLOYMENT}-{i}",
                    examples.cpu(),
                    tls=identities[i],
                    deployment=DEPLOYMENT,
                )
            )
            return workers[-1]

        credentials = Credentials(DEPLOYMENT, ca.cert_pem, TOKEN)
        clients.append(ControllerClient(server.address, credentials=credentials))
        return server, clients[-1], worker

    yield start
    for w in workers:
        w.stop()
    for client in clients:
        client.close()
    for server in servers:
        server.stop(grace_s=0)


def _generate(client: ControllerClient, num_requests: int) -> None:
    for _ in range(num_requests):
        chunks = client.generate("hi", max_tokens=3, timeout_s=5)
        assert sum(len(c["token_ids"]) for c in chunks) == 3  # chunks that wait may merge


def _refusals(caplog, worker_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING
        and worker_id in r.getMessage()
        and "ipv4:" in r.getMessage()
    ]


def test_an_impostor_with_a_live_workers_key_cannot_take_its_place(deployment, caplog):
    server, client, worker = deployment()
    caplog.set_level(logging.INFO, logger="intentserve.controller")
    real = [worker(0), worker(1)]
    for w in real:
        assert w.up().verified
    eventually(lambda: server.deployment_state() is DeploymentState.READY, what="READY")
    registered = [r.getMessage() for r in caplog.records if "registered" in r.getMessage()]
    assert len(registered) == 2 and all("ipv4:127.0.0.1:" in m for m in registered)

    impostor = worker(0)  # replica 0's certificate and key, another process
    with pytest.raises(grpc.RpcError) as refused:
        impostor.register()
    assert refused.value.code() is grpc.StatusCode.ALREADY_EXISTS
    assert f"{DEPLOYMENT}-0" in refused.value.details()
    implausible = dataclasses.replace(real[0].matching_realized(), kv_cache_bytes=TIB)
    with pytest.raises(grpc.RpcError) as stale:
        impostor.report(implausible)
    assert stale.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert impostor.heartbeat() == worker_pb2.HEARTBEAT_ACTION_REGISTER

    record = server.deployment.registry.get(f"{DEPLOYMENT}-0")
    assert (record.state, record.address) == (WorkerState.READY, real[0].address)
    assert server.deployment_state() is DeploymentState.READY
    _generate(client, 10)
    assert real[0].num_requests + real[1].num_requests == 10
    # Each of the impostor's three attempts is logged with its peer; the real registrations too.
    assert len(_refusals(caplog, f"{DEPLOYMENT}-0")) == 3
    assert not _refusals(caplog, f"{DEPLOYMENT}-1")


def test_a_worker_whose_report_is_rejected_is_out_of_service_until_replaced(deployment, caplog):
    """Under minReady 1 of 2, the rejected worker leaves the other serving (DEGRADED), its
    report is never served, and its replacement (a restarted process) heals the deployment."""
    server, client, worker = deployment(min_ready=1)
    caplog.set_level(logging.INFO, logger="intentserve.controller")
    broken, other = worker(0), worker(1)
    assert other.up().verified
    eventually(lambda: server.deployment_state() is DeploymentState.READY, what="READY")
    implausible = dataclasses.replace(other.matching_realized(), kv_cache_bytes=TIB)
    verification = broken.up(implausible)
    assert not verification.verified
    assert verification.reason.code == "realized_report_implausible"
    eventually(lambda: server.deployment_state() is DeploymentState.DEGRADED, what="DEGRADED")
    _generate(client, 4)
    assert (broken.num_requests, other.num_requests) == (0, 4)
    rejected = [r.getMessage() for r in caplog.records if "is rejected" in r.getMessage()]
    assert len(rejected) == 1 and "from ipv4:127.0.0.1:" in rejected[0]

    broken.stop()  # its process exits for a restart; the new one registers under its id
    replacement = worker(0)
    assert replacement.up().verified
    eventually(lambda: server.deployment_state() is DeploymentState.READY, what="READY again")
    _generate(client, 4)
    assert replacement.num_requests + other.num_requests == 8 and replacement.num_requests
