"""Servicer unit tests: each (async) servicer decodes, calls and encodes, called directly on an
event loop with a stand-in for grpc.aio's context.

Status codes for errors come from the interceptor, which is not run here; they are covered in
test_interceptor.py and, end to end on loopback, in test_routing.py (Generate) and
test_lifecycle.py (registration, health, Admin).
"""

import asyncio
from dataclasses import replace

import pytest
from intentserve import convert
from intentserve.client import to_data
from intentserve.controller.cli.render import status_text
from intentserve.controller.control.convert import deployment_state_from_pb, worker_state_from_pb
from intentserve.controller.control.deployment import Deployment
from intentserve.controller.control.servicers import AdminServicer, WorkerRegistryServicer
from intentserve.controller.control.state import DeploymentState, DesiredState, WorkerState
from intentserve.controller.embedded import EmbeddedTable
from intentserve.controller.router.routing import Router
from intentserve.controller.router.servicer import InferenceServicer
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    KvBudget,
    ReasonCode,
    SchedulerIntent,
    examples,
    paged_attention_config,
)
from intentserve.v1 import (
    admin_pb2,
    common_pb2,
    inference_pb2,
    worker_pb2,
)

from tests.controller.conftest import WAITS
from tests.controller.scripted_worker import CONTIGUOUS, ScriptedWorker, realized_for

REGISTRY = "registry"
ADMIN = "admin"


class Context:
    """What the servicers and the router read of a grpc.aio.ServicerContext."""

    def time_remaining(self) -> float | None:
        return None

    def cancelled(self) -> bool:
        return False

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class Harness:
    def __init__(self, mode="on", min_ready=1) -> None:
        desired = DesiredState(
            "d",
            paged_attention_config(mode),
            KvBudget(),
            DEFAULT_AUTO_DEVICES,
            min_ready,
            min_ready,
        )
        self.deployment = Deployment(desired, heartbeat_timeout_s=5.0)
        self.shutdowns = []
        self.router = Router(EmbeddedTable(self.deployment), queue_wait_times=WAITS)
        self.servicers = {
            REGISTRY: WorkerRegistryServicer(self.deployment, heartbeat_interval_s=0.25),
            ADMIN: AdminServicer(self.deployment, lambda: self.shutdowns.append(1)),
        }
        self.inference = InferenceServicer(
            self.router, TokenizeRoute(EmbeddedTable(self.deployment), self.router.channels)
        )
        self.tokens: dict[str, bytes] = {}  # each worker's registration token

    def call(self, service, method, request):
        """The servicer's response; an error it raises fails the test."""
        return asyncio.run(getattr(self.servicers[service], method)(request, Context()))

    def generate(self, request) -> list[inference_pb2.GenerateResponse]:
        async def collect():
            return [r async for r in self.inference.Generate(request, Context())]

        return asyncio.run(collect())

    def register(self, worker_id="w0", capability=None, address="127.0.0.1:1"):
        request = worker_pb2.RegisterRequest(
            worker_id=worker_id,
            address=address,
            capability=convert.capability_to_pb(capability or examples.cpu()),
        )
        response = self.call(REGISTRY, "Register", request)
        self.tokens[worker_id] = response.registration_token
        return response

    def report(self, worker_id="w0", realized=None):
        token = self.tokens[worker_id]
        request = worker_pb2.RealizedReport(worker_id=worker_id, registration_token=token)
        request.realized.CopyFrom(convert.realized_to_pb(realized))
        return self.call(REGISTRY, "ReportRealized", request)

    def up(self, worker_id="w0", address="127.0.0.1:1"):
        response = self.register(worker_id, address=address)
        config, resolution, _ = convert.resolution_from_pb(response.config)
        return self.report(worker_id, realized_for(config, resolution))


@pytest.fixture
def harness():
    return Harness()


def test_register_returns_the_resolved_config_and_the_heartbeat_interval(harness):
    response = harness.register()
    config, resolution, kv_budget = convert.resolution_from_pb(response.config)
    assert config == paged_attention_config("on")
    assert kv_budget == KvBudget()
    assert resolution.paged_attention.enabled and resolution.paged_attention.required
    assert response.heartbeat_interval_s == 0.25
    assert harness.deployment.registry.get("w0").state is WorkerState.LOADING


def test_report_realized_returns_the_verification(harness):
    assert harness.up().verified
    harness.register("w1")
    verification = harness.report("w1", CONTIGUOUS)
    assert not verification.verified
    assert verification.reason.code == ReasonCode.PAGED_REQUIRED_NOT_REALIZED.value


def test_heartbeat_returns_the_action_and_records_the_load(harness):
    beat = worker_pb2.HeartbeatRequest(worker_id="w0", num_kv_used=7, num_kv_total=64)
    assert harness.call(REGISTRY, "Heartbeat", beat).action == worker_pb2.HEARTBEAT_ACTION_REGISTER
    harness.up()
    # Without the registration's token it is another process's: nothing is recorded.
    assert harness.call(REGISTRY, "Heartbeat", beat).action == worker_pb2.HEARTBEAT_ACTION_REGISTER
    assert harness.deployment.registry.get("w0").load.num_kv_used == 0
    beat.registration_token = harness.tokens["w0"]
    assert harness.call(REGISTRY, "Heartbeat", beat).action == worker_pb2.HEARTBEAT_ACTION_CONTINUE
    assert harness.deployment.registry.get("w0").load.num_kv_used == 7


def test_status_reports_the_deployment_and_every_worker():
    harness = Harness(min_ready=2)
    harness.up("w0")
    harness.register("w1")
    status = harness.call(ADMIN, "Status", admin_pb2.StatusRequest())
    assert status.deployment == "d"
    assert deployment_state_from_pb(status.state) is DeploymentState.PENDING
    assert status.reason.code == ReasonCode.NOT_ENOUGH_REPLICAS.value
    assert (status.min_ready, status.num_verified) == (2, 1)
    assert status.policy.mode == common_pb2.MODE_ON
    assert status.weights == common_pb2.WEIGHT_FORMAT_AUTO
    w0, w1 = status.workers
    assert worker_state_from_pb(w0.state) is WorkerState.READY
    assert w0.realized.cache_kind == common_pb2.CACHE_KIND_PAGED
    assert w0.device_kind == common_pb2.DEVICE_KIND_CPU
    assert [d.feature for d in w0.decisions] == ["paged_attention", "prefix_caching"]
    assert worker_state_from_pb(w1.state) is WorkerState.LOADING
    assert not w1.HasField("realized")
    assert w1.reasons[0].code == ReasonCode.WORKER_PENDING.value
    assert not status.HasField("scheduler")  # a controller given no scheduler settings


def test_status_and_the_cli_name_the_scheduler_settings_the_controller_checks():
    harness = Harness()
    harness.deployment.desired = replace(
        harness.deployment.desired, scheduler=SchedulerIntent(stream_interval=4)
    )
    status = harness.call(ADMIN, "Status", admin_pb2.StatusRequest())
    assert status.scheduler.stream_interval == 4
    assert not status.scheduler.HasField("max_model_len")  # not written: not checked
    lines = status_text(to_data(status)).splitlines()
    assert lines[4] == "scheduler: streamInterval 4 (each worker must report it)"
    harness.deployment.desired = replace(
        harness.deployment.desired, scheduler=SchedulerIntent(stream_interval=1, max_model_len=512)
    )
    status = harness.call(ADMIN, "Status", admin_pb2.StatusRequest())
    assert status_text(to_data(status)).splitlines()[4] == (
        "scheduler: streamInterval 1, maxModelLen 512 (each worker must report them)"
    )


def test_status_text_names_the_tensors_a_native_worker_holds(harness):
    response = harness.register()
    config, resolution, _ = convert.resolution_from_pb(response.config)
    held = "tensors held as in the file: 210 Q4_1, 1 Q8_0; dequantized: none"
    harness.report("w0", replace(realized_for(config, resolution), weights_held=held))
    status = harness.call(ADMIN, "Status", admin_pb2.StatusRequest())
    assert status.workers[0].realized.weights_held == held
    lines = status_text(to_data(status)).splitlines()
    assert lines[lines.index("native weights:") + 1] == f"  w0: {held}"
    explained = harness.call(ADMIN, "Explain", admin_pb2.ExplainRequest(worker_id="w0")).lines
    assert any(line.startswith("realized:") and held in line for line in explained)


def test_explain_tells_the_chain_in_order(harness):
    harness.up()
    response = harness.call(ADMIN, "Explain", admin_pb2.ExplainRequest(worker_id="w0"))
    prefixes = [line.split(":", 1)[0] for line in response.lines]
    assert prefixes == [
        "intent",
        "capability",
        "decision",
        "decision",
        "decision",
        "decision",
        "realized",
        "verdict",
        "deployment",
    ]
    assert response.lines[0].startswith("intent: paged_attention 'on'")
    assert "cpu worker, model LlamaForCausalLM" in response.lines[1]
    assert "weights 'auto'" in response.lines[0]
    assert response.lines[4].startswith("decision: weights (auto): dequantized - auto keeps")
    assert "dequantized weights" in response.lines[6]
    assert response.lines[-2].startswith("verdict: READY")
    assert response.worker.worker_id == "w0"


def test_drain_and_shutdown(harness):
    harness.up()
    # min_ready 1: draining the only worker stops the deployment serving, so it must be forced.
    drained = harness.call(ADMIN, "Drain", admin_pb2.DrainRequest(worker_id="w0", force=True))
    assert worker_state_from_pb(drained.state) is WorkerState.DRAINING
    resumed = harness.call(ADMIN, "Resume", admin_pb2.ResumeRequest(worker_id="w0"))
    assert worker_state_from_pb(resumed.state) is WorkerState.READY
    harness.call(ADMIN, "Shutdown", admin_pb2.ShutdownRequest())
    assert harness.shutdowns == [1]


@pytest.mark.integration
def test_generate_streams_what_the_worker_streams(harness):
    worker = ScriptedWorker("127.0.0.1:9", "w0", examples.cpu(), num_tokens=3)
    try:
        harness.up("w0", address=worker.address)
        request = inference_pb2.GenerateRequest(
            prompt="hi", stop=inference_pb2.StopConditions(max_tokens=3)
        )
        responses = harness.generate(request)
    finally:
        worker.stop()
        harness.router.close()
    assert [t for r in responses for t in r.token_ids] == [100, 101, 102]  # chunks may merge
    assert {r.worker_id for r in responses} == {"w0"}
    assert responses[0].request_id  # generated when the client left it empty
    assert worker.requests[0].request_id == responses[0].request_id
