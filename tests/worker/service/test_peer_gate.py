"""A worker's server under TLS takes calls from its controller and the routers only, its own
deployment's: the gate with the worker's own peers, on a real loopback server with certificates
of one CA (which another deployment may share)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from intentserve.common.tls import PeerGate, secure_channel, server_credentials, server_name
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.v1 import worker_pb2, worker_pb2_grpc
from intentserve.worker.service.server import PEERS

pytestmark = pytest.mark.integration
DEPLOYMENT = "gate"


class Info(worker_pb2_grpc.WorkerInfoServiceServicer):
    def Info(self, request, context):
        return worker_pb2.WorkerInfo(worker_id="gate-0")


@pytest.fixture(scope="module")
def worker_server():
    ca = DeploymentCa.create(DEPLOYMENT)
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[PeerGate(PEERS, DEPLOYMENT)])
    worker_pb2_grpc.add_WorkerInfoServiceServicer_to_server(Info(), server)
    identity = ca.issue("gate-0", hosts=("127.0.0.1",))
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(identity, require_client_auth=True)
    )
    server.start()
    yield ca, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize(
    ("holder", "admitted"), [("controller", True), ("router", True), ("gate-1", False)]
)
def test_the_controller_and_routers_are_admitted_and_another_worker_is_not(
    worker_server, holder, admitted
):
    ca, address = worker_server
    channel = secure_channel(address, ca.issue(holder), server_name(DEPLOYMENT, "gate-0"))
    try:
        info = worker_pb2_grpc.WorkerInfoServiceStub(channel).Info(
            worker_pb2.InfoRequest(), timeout=5
        )
        assert admitted and info.worker_id == "gate-0"
    except grpc.RpcError as error:
        assert not admitted and error.code() is grpc.StatusCode.PERMISSION_DENIED, error
        assert error.details() == "only controller, router may call this server"
    finally:
        channel.close()


def test_a_router_or_controller_of_another_deployment_of_the_same_ca_is_not_admitted(
    worker_server, tmp_path
):
    """A CA shared between deployments: the other's `router` and `controller` certificates name
    the right role of the wrong deployment."""
    ca, address = worker_server
    shared = DeploymentCa.load("other", *ca.write(tmp_path / "shared-ca"))
    for holder in ("router", "controller"):
        channel = secure_channel(address, shared.issue(holder), server_name(DEPLOYMENT, "gate-0"))
        with pytest.raises(grpc.RpcError) as refused:
            worker_pb2_grpc.WorkerInfoServiceStub(channel).Info(worker_pb2.InfoRequest(), timeout=5)
        channel.close()
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED, holder
        assert "of deployment 'other', not of 'gate'" in refused.value.details(), holder
