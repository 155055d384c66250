"""A real controller on a loopback port with scripted workers: intent resolution, verification,
the readiness gate through `grpc.health.v1`, loss and re-registration, status and explain."""

import os
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from intentserve import convert
from intentserve.client import ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.controller.control.convert import deployment_state_from_pb, worker_state_from_pb
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.controller.grpc_server import SERVICE_NAMES
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy import ReasonCode, examples
from intentserve.v1 import admin_pb2, worker_pb2, worker_pb2_grpc

from tests.controller.conftest import DEPLOYMENT, Client, eventually
from tests.controller.scripted_worker import CONTIGUOUS, PAGED

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
BERT = examples.cpu(model=examples.BERT)


def assert_health(client: Client, status: int) -> None:
    """Both the overall service ("") and the deployment's name say the same."""
    assert client.health_status("") == status
    assert client.health_status(DEPLOYMENT) == status


def workers_by_id(client: Client) -> dict[str, admin_pb2.WorkerStatus]:
    return {w.worker_id: w for w in client.status().workers}


def test_on_with_a_worker_that_cannot_realize_it_is_rejected(start_controller, make_worker):
    server, client = start_controller(paged_attention="on")
    worker = make_worker(server, "w0", BERT)
    response = worker.register()
    # The refusal is a structured reason in the answer, never a status string to be split.
    assert response.WhichOneof("outcome") == "rejection"
    assert worker.rejection.code is ReasonCode.MODEL_HAS_NO_KV_CACHE
    assert worker.rejection.message == "the model (BertModel) has no KV cache to page"
    verdict = server.wait_until_settled(timeout_s=5)
    assert verdict.failed and not verdict.ready
    eventually(lambda: server.deployment_state() is DeploymentState.FAILED)
    assert_health(client, NOT_SERVING)
    status = client.status()
    assert deployment_state_from_pb(status.state) is DeploymentState.FAILED
    assert status.reason.code == ReasonCode.POLICY_VIOLATION.value
    assert "worker w0: the model (BertModel) has no KV cache" in status.reason.message
    (w0,) = status.workers
    assert worker_state_from_pb(w0.state) is WorkerState.REJECTED
    assert w0.reasons[0].code == ReasonCode.MODEL_HAS_NO_KV_CACHE.value


def test_on_with_a_worker_that_loads_without_paging_is_rejected(start_controller, make_worker):
    server, client = start_controller(paged_attention="on")
    verification = make_worker(server, "w0", examples.cpu()).up(CONTIGUOUS)
    assert not verification.verified
    assert verification.reason.code == ReasonCode.PAGED_REQUIRED_NOT_REALIZED.value
    assert server.wait_until_settled(timeout_s=5).failed
    assert_health(client, NOT_SERVING)
    assert "requires a paged KV cache" in client.status().reason.message


def test_auto_with_the_same_worker_is_ready_and_says_why_it_fell_back(
    start_controller, make_worker
):
    server, client = start_controller(paged_attention="auto")
    assert make_worker(server, "w0", BERT).up().verified
    assert server.wait_until_settled(timeout_s=5).ready
    eventually(client.serving, what="SERVING")
    assert_health(client, SERVING)
    status = client.status()
    assert deployment_state_from_pb(status.state) is DeploymentState.READY
    (w0,) = status.workers
    assert worker_state_from_pb(w0.state) is WorkerState.READY
    assert w0.reasons[0].code == ReasonCode.MODEL_HAS_NO_KV_CACHE.value
    assert [r.code for r in w0.realized.fallback_reasons][0] == "model_has_no_kv_cache"


def test_off_with_a_worker_that_realized_a_paged_cache_is_a_violation(
    start_controller, make_worker
):
    server, client = start_controller(paged_attention="off")
    verification = make_worker(server, "w0", examples.cpu()).up(PAGED)
    assert not verification.verified
    assert verification.reason.code == ReasonCode.PAGED_REALIZED_WHILE_OFF.value
    assert server.wait_until_settled(timeout_s=5).failed
    assert_health(client, NOT_SERVING)
    assert "realized a paged KV cache" in client.status().reason.message


def test_two_workers_of_which_one_disagrees_is_not_ready(start_controller, make_worker):
    server, client = start_controller(paged_attention="on", replicas=2)
    assert make_worker(server, "w0", examples.cpu()).up().verified
    assert not make_worker(server, "w1", examples.cpu()).up(CONTIGUOUS).verified
    verdict = server.wait_until_settled(timeout_s=5)
    assert not verdict.ready and verdict.num_verified == 1
    assert_health(client, NOT_SERVING)
    workers = workers_by_id(client)
    assert worker_state_from_pb(workers["w0"].state) is WorkerState.READY
    assert worker_state_from_pb(workers["w1"].state) is WorkerState.REJECTED


def test_a_lost_worker_registers_again_and_is_verified_from_scratch(start_controller, make_worker):
    server, client = start_controller(paged_attention="on")
    worker = make_worker(server, "w0", examples.cpu())
    worker.up()
    eventually(client.serving, what="SERVING")
    worker.stop_heartbeats()
    eventually(lambda: not client.serving(), what="NOT_SERVING after the worker went silent")
    w0 = workers_by_id(client)["w0"]
    assert worker_state_from_pb(w0.state) is WorkerState.LOST
    assert w0.reasons[0].message.startswith("lost: no heartbeat for")
    assert worker.heartbeat() == worker_pb2.HEARTBEAT_ACTION_REGISTER
    worker.register()
    worker.start_heartbeats()
    eventually(lambda: worker_state_from_pb(workers_by_id(client)["w0"].state).name == "LOADING")
    assert_health(client, NOT_SERVING)  # registered again, not verified yet
    assert worker.report().verified
    eventually(client.serving, what="SERVING again")
    assert workers_by_id(client)["w0"].last_heartbeat_age_s < 1.0


def test_realized_state_that_drifts_takes_the_worker_out_of_service(start_controller, make_worker):
    server, client = start_controller(paged_attention="on")
    worker = make_worker(server, "w0", examples.cpu())
    worker.up()
    eventually(client.serving, what="SERVING")
    assert not worker.report(CONTIGUOUS).verified
    eventually(lambda: not client.serving(), what="NOT_SERVING after the drift")
    assert worker_state_from_pb(workers_by_id(client)["w0"].state) is WorkerState.REJECTED


def test_health_watch_streams_every_change(start_controller, make_worker):
    server, client = start_controller(paged_attention="on")
    watch = client.health.Watch(health_pb2.HealthCheckRequest(service=DEPLOYMENT), timeout=10)
    assert next(watch).status == NOT_SERVING
    make_worker(server, "w0", examples.cpu()).up()
    assert next(watch).status == SERVING
    watch.cancel()


def test_unknown_health_service_is_not_found(start_controller):
    _, client = start_controller()
    with pytest.raises(grpc.RpcError) as error:
        client.health_status("no-such-deployment")
    assert error.value.code() is grpc.StatusCode.NOT_FOUND


def test_reflection_lists_every_service(start_controller):
    _, client = start_controller()
    database = ProtoReflectionDescriptorDatabase(client.channel)
    assert set(database.get_services()) == set(SERVICE_NAMES)
    assert database.FindFileContainingSymbol("intentserve.v1.Admin").name.endswith("admin.proto")


def test_status_and_explain_of_one_good_and_one_rejected_worker(start_controller, make_worker):
    server, client = start_controller(paged_attention="on", replicas=2)
    make_worker(server, "good", examples.cpu()).up()
    rejected = make_worker(server, "rejected", examples.mixed())
    assert rejected.register().WhichOneof("outcome") == "rejection"
    eventually(lambda: server.deployment_state() is DeploymentState.FAILED)
    status = client.status()
    assert (status.min_ready, status.num_verified) == (2, 1)
    good, rejected = status.workers
    assert (good.worker_id, rejected.worker_id) == ("good", "rejected")
    assert good.num_kv_total == 64 and good.realized.num_blocks == 64
    assert rejected.reasons[0].code == ReasonCode.DEVICE_MAP_MIXED.value
    explained = client.admin.Explain(admin_pb2.ExplainRequest(worker_id="rejected"), timeout=5)
    assert "layers on cpu and cuda" in explained.lines[1]
    assert explained.lines[-2].startswith("verdict: REJECTED at registration - device_map_mixed")
    with pytest.raises(grpc.RpcError) as error:
        client.admin.Explain(admin_pb2.ExplainRequest(worker_id="ghost"), timeout=5)
    assert error.value.code() is grpc.StatusCode.NOT_FOUND


def test_bad_registrations_are_invalid_arguments_naming_the_field(start_controller):
    _, client = start_controller()
    registry = worker_pb2_grpc.WorkerRegistryStub(client.channel)
    cases = [
        (registry.Register, worker_pb2.RegisterRequest(worker_id="w0", address="a:1")),
        (registry.Register, worker_pb2.RegisterRequest(address="a:1")),
        (registry.ReportRealized, worker_pb2.RealizedReport(worker_id="w0")),
        (registry.Heartbeat, worker_pb2.HeartbeatRequest()),
    ]
    details = []
    for method, request in cases:
        with pytest.raises(grpc.RpcError) as error:
            method(request, timeout=5)
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        details.append(error.value.details())
    assert details == [
        "capability: must be set",
        "worker_id: must not be empty",
        "realized: must be set (or load_error)",
        "worker_id: must not be empty",
    ]
    report = worker_pb2.RealizedReport(worker_id="ghost")
    report.realized.CopyFrom(convert.realized_to_pb(PAGED))
    with pytest.raises(grpc.RpcError) as error:
        registry.ReportRealized(report, timeout=5)
    assert error.value.code() is grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "unknown worker 'ghost'"


def test_admin_shutdown_ends_wait(start_controller):
    server, client = start_controller()
    assert not server.wait(timeout_s=0.01)
    client.admin.Shutdown(admin_pb2.ShutdownRequest(), timeout=5)
    assert server.wait(timeout_s=5)


def test_python_m_controller_server_runs_one_with_tls(tmp_path):
    ca = DeploymentCa.create("intentserve")
    ca_file, _ = ca.write(tmp_path / "ca")
    identity = ca.controller_identity(())
    (tmp_path / "tls.crt").write_bytes(identity.cert_pem)
    (tmp_path / "tls.key").write_bytes(identity.key_pem)
    (tmp_path / "admin-token").write_text("s3cret\n")
    env = {
        **os.environ,
        "INTENTSERVE_PORT": "0",
        "INTENTSERVE_HOST": "127.0.0.1",
        "INTENTSERVE_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
        "INTENTSERVE_TLS_KEY_FILE": str(tmp_path / "tls.key"),
        "INTENTSERVE_TLS_CA_FILE": str(ca_file),
        "INTENTSERVE_ADMIN_TOKEN_FILE": str(tmp_path / "admin-token"),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "intentserve.controller.server"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert "listening on 127.0.0.1:" in line  # the address really bound
        address = line.rsplit(" ", 1)[1].strip()
        client = ControllerClient(
            address, credentials=Credentials("intentserve", ca.cert_pem, "s3cret")
        )
        assert client.health("intentserve") == "not_serving"
        client.shutdown()
        assert process.wait(timeout=10) == 0
        client.close()
    finally:
        process.kill()


def test_python_m_controller_server_refuses_to_run_without_tls_or_insecure():
    env = {**os.environ, "INTENTSERVE_PORT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "intentserve.controller.server"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "tls_cert_file: no TLS files are given" in done.stderr
    assert "insecure=true" in done.stderr


def test_python_m_controller_server_refuses_bad_settings():
    env = {**os.environ, "INTENTSERVE_PAGED_ATTENTION": "sometimes"}
    done = subprocess.run(
        [sys.executable, "-m", "intentserve.controller.server"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "paged_attention (INTENTSERVE_PAGED_ATTENTION): invalid value 'sometimes'" in (
        done.stderr
    )


def test_a_second_controller_on_a_taken_port_is_refused(start_controller):
    server, _ = start_controller()
    with pytest.raises(RuntimeError, match="Failed to bind"):
        ControllerServer(
            ControllerSettings(host="127.0.0.1", port=server.bound_port, insecure=True).config()
        )
    # The refused one's event loop thread is gone with it.
    loops = [t for t in threading.enumerate() if t.name == "controller-rpc"]
    assert len(loops) == 1


def test_a_taken_http_port_is_refused_before_a_grpc_server_is_made(made_aio_servers, taken_port):
    settings = ControllerSettings(host="127.0.0.1", port=0, http_port=taken_port, insecure=True)
    with pytest.raises(RuntimeError, match=f"cannot serve HTTP on 127.0.0.1:{taken_port}"):
        ControllerServer(settings.config())
    assert made_aio_servers == []
