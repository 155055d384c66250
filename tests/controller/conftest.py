"""Fixtures: a real controller on a loopback port, scripted workers, polling with deadlines."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client.credentials import Credentials
from intentserve.controller.router.request_metrics import RequestMetrics
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy import Capability, examples
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc
from prometheus_client import CollectorRegistry

from tests.controller.scripted_worker import ScriptedWorker

DEPLOYMENT = "test-deployment"
FAST = {
    "host": "127.0.0.1",
    "port": 0,
    "deployment": DEPLOYMENT,
    "heartbeat_interval_s": 0.1,
    "heartbeat_timeout_s": 1.0,
    "reconcile_interval_s": 0.05,
    # Scripted workers speak plaintext; tests/test_security.py runs the controller with TLS.
    "insecure": True,
}


# What a Python client of the plaintext test controller is given.
PLAINTEXT = Credentials(DEPLOYMENT)
# Where a router built by hand (no server) puts its queue's wait times.
WAITS = RequestMetrics(CollectorRegistry(), deployment=DEPLOYMENT, model="m").queue_wait_times


def ready(start_controller, make_worker, **worker_kwargs):
    """A controller (paged attention on, 64 requests per worker) with one verified scripted
    worker "w0" (`worker_kwargs`: its behaviour), READY."""
    server, _ = start_controller(paged_attention="on", max_outstanding_per_worker=64)
    worker = make_worker(server, "w0", examples.cpu(), **worker_kwargs)
    assert worker.up().verified
    eventually(lambda: server.verdict().ready, what="READY")
    return server, worker


def eventually(predicate: Callable[[], object], timeout_s: float = 5.0, what: str = "") -> object:
    """Poll until `predicate()` is truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(0.01)


class Client:
    """What an operator or an inference client holds: channels to the controller's services."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def status(self) -> admin_pb2.StatusResponse:
        return self.admin.Status(admin_pb2.StatusRequest(), timeout=5)

    def health_status(self, service: str = "") -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return self.health.Check(request, timeout=5).status

    def serving(self) -> bool:
        return self.health_status() == health_pb2.HealthCheckResponse.SERVING

    def generate(self, prompt: str = "hello", max_tokens: int = 4, **kwargs):
        request = inference_pb2.GenerateRequest(
            prompt=prompt, stop=inference_pb2.StopConditions(max_tokens=max_tokens)
        )
        return self.inference.Generate(request, **kwargs)


@pytest.fixture
def start_controller():
    servers: list[ControllerServer] = []
    clients: list[Client] = []

    def start(**overrides) -> tuple[ControllerServer, Client]:
        server = ControllerServer(ControllerSettings(**{**FAST, **overrides}).config()).start()
        servers.append(server)
        clients.append(Client(server.address))
        return server, clients[-1]

    yield start
    for client in clients:
        client.channel.close()
    for server in servers:
        server.stop(grace_s=0)


@pytest.fixture
def make_worker():
    workers: list[ScriptedWorker] = []

    def make(server: ControllerServer, worker_id: str, capability: Capability, **kwargs):
        workers.append(ScriptedWorker(server.address, worker_id, capability, **kwargs))
        return workers[-1]

    yield make
    for worker in workers:
        worker.stop()


@pytest.fixture
def made_aio_servers(monkeypatch) -> list[grpc.aio.Server]:
    """Every grpc.aio server made while the test runs.

    NOTE: a grpc.aio server made and never started cannot be stopped (its stop() does nothing
    in that state); one kept alive to interpreter exit fails in its finalizer, which printed
    "Error in sys.excepthook:" after the whole suite's summary. So a server that a taken port
    refuses must bind every such port before it makes its gRPC server."""
    made: list[grpc.aio.Server] = []
    make = grpc.aio.server

    def recorded(*args, **kwargs) -> grpc.aio.Server:
        made.append(make(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(grpc.aio, "server", recorded)
    return made


@pytest.fixture
def taken_port():
    """A loopback port that something else listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]
