"""The worker's registry client finds a controller that comes back on its address soon after it
listens, however long it was away: a restarted controller hears from its workers (and asks them
to register again) within about a heartbeat, not after gRPC's reconnect backoff has grown. When
it registers again it proves its current registration, so a controller that still knows it live
lets it replace that registration."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from intentserve import convert
from intentserve.policy import Reason, ReasonCode, examples
from intentserve.v1 import worker_pb2, worker_pb2_grpc
from intentserve.worker.runtime.heartbeat import IDLE
from intentserve.worker.runtime.registry_client import Action, RegistryClient, Rejected

from tests.launcher.up_process import free_port

AWAY_S = 20.0  # gRPC's default backoff has grown to ~10 s between attempts by then
FOUND_WITHIN_S = 2.5  # a heartbeat (1 s) plus one reconnect
REFUSED = Reason(ReasonCode.DEVICE_MAP_MIXED, "a stand-in refusal")


class _Controller(worker_pb2_grpc.WorkerRegistryServicer):
    def __init__(self) -> None:
        self.proofs: list[bytes] = []  # each registration's registration_token, in order

    def Register(self, request, context):
        self.proofs.append(request.registration_token)
        # NOTE: a refusal is the shortest answer that still hands out a registration token
        response = worker_pb2.RegisterResponse(registration_token=f"t{len(self.proofs)}".encode())
        response.rejection.CopyFrom(convert.reason_to_pb(REFUSED))
        return response

    def Heartbeat(self, request, context):
        return worker_pb2.HeartbeatResponse(action=worker_pb2.HEARTBEAT_ACTION_REGISTER)


def _serve(port: int, controller: _Controller | None = None) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    worker_pb2_grpc.add_WorkerRegistryServicer_to_server(controller or _Controller(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    return server.start() or server


def _heartbeat(client: RegistryClient) -> Action | None:
    try:
        return client.heartbeat(IDLE, timeout_s=2.0)
    except grpc.RpcError:
        return None


def test_registering_again_proves_the_current_registration():
    port, controller = free_port(), _Controller()
    server = _serve(port, controller)
    client = RegistryClient(f"127.0.0.1:{port}", "w0", rpc_timeout_s=2.0)
    try:
        for _ in range(3):
            with pytest.raises(Rejected):
                client.register("127.0.0.1:1", examples.cpu(), wait_s=5.0)
    finally:
        client.close()
        server.stop(0)
    assert controller.proofs == [b"", b"t1", b"t2"]


@pytest.mark.integration
def test_a_controller_back_after_a_long_absence_is_heard_within_a_heartbeat():
    port = free_port()
    controller = _serve(port)
    client = RegistryClient(f"127.0.0.1:{port}", "w0", rpc_timeout_s=2.0)
    try:
        assert _heartbeat(client) is Action.REGISTER
        controller.stop(0)
        gone_s = time.monotonic()
        while time.monotonic() - gone_s < AWAY_S:  # the heartbeat thread keeps trying
            assert _heartbeat(client) is None
            time.sleep(1.0)
        controller = _serve(port)
        back_s = time.monotonic()
        while _heartbeat(client) is None:
            assert time.monotonic() - back_s < 30, "the controller was never heard again"
            time.sleep(1.0)
        assert time.monotonic() - back_s < FOUND_WITHIN_S
    finally:
        client.close()
        controller.stop(0)
