"""The worker state machine and the policy checks applied to it, on a fake clock (no gRPC)."""

from dataclasses import replace

import pytest
from intentserve.controller.control.deployment import Deployment, deployment_state
from intentserve.controller.control.explain import explain
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import (
    DeploymentState,
    DesiredState,
    HeartbeatAction,
    WorkerState,
)
from intentserve.controller.errors import UnknownWorker, WrongState
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    KvBudget,
    Reason,
    ReasonCode,
    SchedulerIntent,
    WeightFormat,
    WeightFormatStatus,
    examples,
    paged_attention_config,
)

from tests.controller.scripted_worker import CONTIGUOUS, PAGED, realized_for

TIMEOUT_S = 1.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def make(mode="on", min_ready=1, replicas=None):
    clock = Clock()
    changes = []
    desired = DesiredState(
        "d",
        paged_attention_config(mode),
        KvBudget(),
        DEFAULT_AUTO_DEVICES,
        replicas=replicas or min_ready,
        min_ready=min_ready,
    )
    deployment = Deployment(
        desired, heartbeat_timeout_s=TIMEOUT_S, clock=clock, on_change=lambda: changes.append(1)
    )
    return deployment, clock, changes


def up(deployment, worker_id="w0", capability=None, realized=None):
    """Register and report what matches the resolution (or `realized`)."""
    capability = capability or examples.cpu()
    resolution = deployment.register(worker_id, f"{worker_id}:1", capability)
    return resolution, report(deployment, resolution, worker_id, capability, realized)


def report(deployment, resolution, worker_id="w0", capability=None, realized=None):
    """Report what matches the resolution (or `realized`) for a registered worker."""
    model = (capability or examples.cpu()).model
    state = realized or realized_for(deployment.desired.policy, resolution, model)
    return deployment.report_realized(worker_id, state, None)


def state_of(deployment, worker_id="w0"):
    return deployment.registry.get(worker_id).state


def test_accepted_worker_loads_then_becomes_ready_when_verified():
    deployment, _, changes = make("on")
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    assert resolution.paged_attention.enabled and state_of(deployment) is WorkerState.LOADING
    assert deployment_state(deployment.verdict()) is DeploymentState.PENDING
    problem = deployment.report_realized("w0", CONTIGUOUS, None)
    assert problem.code is ReasonCode.PAGED_REQUIRED_NOT_REALIZED
    assert state_of(deployment) is WorkerState.REJECTED
    up(deployment)
    assert state_of(deployment) is WorkerState.READY
    assert deployment_state(deployment.verdict()) is DeploymentState.READY
    assert changes  # every transition wakes the reconcile loop


def test_on_with_a_worker_that_cannot_realize_it_is_rejected_with_the_reason():
    deployment, _, _ = make("on")
    resolution = deployment.register("w0", "w0:1", examples.cpu(model=examples.BERT))
    assert resolution.rejection.code is ReasonCode.MODEL_HAS_NO_KV_CACHE
    assert resolution.rejection.message.startswith("the model (BertModel)")
    assert state_of(deployment) is WorkerState.REJECTED
    verdict = deployment.verdict()
    assert verdict.failed and deployment_state(verdict) is DeploymentState.FAILED
    assert verdict.reason.message.startswith("worker w0: the model (BertModel) has no KV cache")


def test_auto_with_the_same_worker_falls_back_and_says_why():
    deployment, _, _ = make("auto")
    up(deployment, capability=examples.cpu(model=examples.BERT))
    record = deployment.registry.get("w0")
    assert record.state is WorkerState.READY and deployment.verdict().ready
    assert ReasonCode.MODEL_HAS_NO_KV_CACHE in {r.code for r in record.reasons}


def test_an_impossible_report_from_a_registered_worker_is_rejected_with_its_own_code():
    # The worker is who it says it is (registered); what it says it built cannot be true.
    deployment, _, _ = make("on")
    forged = replace(PAGED, num_blocks=100_000_000, kv_cache_bytes=1 << 40)
    _, problem = up(deployment, realized=forged)
    assert problem.code is ReasonCode.REALIZED_REPORT_IMPLAUSIBLE
    assert "bytes of memory are free" in problem.message
    assert state_of(deployment) is WorkerState.REJECTED
    # Not a policy failure: that worker is out of service until a fresh process replaces it.
    verdict = deployment.verdict()
    assert deployment_state(verdict) is DeploymentState.PENDING
    assert verdict.reason.message.startswith("0 of 1 required replicas verified; not serving: w0")
    assert not deployment.registry.try_acquire("w0", 10)


def test_off_with_a_worker_that_realized_a_paged_cache_is_a_violation():
    deployment, _, _ = make("off")
    _, problem = up(deployment, realized=PAGED)
    assert problem.code is ReasonCode.PAGED_REALIZED_WHILE_OFF
    assert state_of(deployment) is WorkerState.REJECTED
    assert deployment_state(deployment.verdict()) is DeploymentState.FAILED


def test_a_load_error_rejects_the_worker_with_that_reason():
    deployment, _, _ = make("on")
    deployment.register("w0", "w0:1", examples.cpu())
    load_error = Reason(ReasonCode.KV_BUDGET_TOO_SMALL, "0 blocks fit in 1 MiB")
    assert deployment.report_realized("w0", None, load_error) == load_error
    assert deployment.registry.get("w0").problem == load_error


def test_a_rejected_worker_stays_rejected_until_it_registers_again():
    deployment, _, _ = make("on")
    assert not deployment.register("w0", "w0:1", examples.cpu(model=examples.BERT)).accepted
    problem = deployment.report_realized("w0", PAGED, None)
    assert problem.code is ReasonCode.MODEL_HAS_NO_KV_CACHE
    assert state_of(deployment) is WorkerState.REJECTED
    up(deployment)
    assert state_of(deployment) is WorkerState.READY


def test_realized_state_that_drifts_takes_a_ready_worker_out_of_service():
    deployment, _, _ = make("on")
    up(deployment)
    problem = deployment.report_realized("w0", CONTIGUOUS, None)
    assert problem.code is ReasonCode.PAGED_REQUIRED_NOT_REALIZED
    assert state_of(deployment) is WorkerState.REJECTED
    assert not deployment.verdict().ready


def test_a_scheduler_that_does_not_match_the_cache_is_refused():
    deployment, _, _ = make("on")
    _, problem = up(deployment, realized=replace(PAGED, scheduler=None))
    assert problem.code is ReasonCode.SCHEDULER_MISMATCH


def test_two_workers_of_which_one_disagrees_is_not_ready():
    deployment, _, _ = make("on", min_ready=1)
    up(deployment, "w0")
    up(deployment, "w1", realized=CONTIGUOUS)
    verdict = deployment.verdict()
    assert not verdict.ready and verdict.num_verified == 1
    assert [w for w, _ in verdict.worker_reasons] == ["w1"]


def test_silent_workers_become_lost_and_come_back_from_scratch():
    deployment, clock, _ = make("on")
    up(deployment)
    assert not deployment.register("bad", "bad:1", examples.mixed()).accepted
    clock.now_s += TIMEOUT_S / 2
    assert deployment.heartbeat("w0", WorkerLoad(num_kv_used=5)) is HeartbeatAction.CONTINUE
    clock.now_s += TIMEOUT_S
    assert deployment.mark_lost(TIMEOUT_S) == ()  # w0 beat; a rejected worker is not watched
    clock.now_s += TIMEOUT_S
    (lost,) = deployment.mark_lost(TIMEOUT_S)
    assert lost.worker_id == "w0" and lost.state is WorkerState.LOST
    assert "no heartbeat for 2.0 s (timeout 1 s)" in lost.problem.message
    assert deployment.mark_lost(TIMEOUT_S) == ()  # idempotent
    assert deployment.heartbeat("w0", WorkerLoad()) is HeartbeatAction.REGISTER
    with pytest.raises(WrongState, match="'w0' is lost .*register again"):
        deployment.report_realized("w0", PAGED, None)
    deployment.register("w0", "w0:2", examples.cpu())
    record = deployment.registry.get("w0")
    assert (record.state, record.realized, record.problem) == (WorkerState.LOADING, None, None)
    assert record.num_registrations == 2 and record.address == "w0:2"


def test_heartbeat_from_an_unknown_worker_asks_it_to_register():
    deployment, _, _ = make()
    assert deployment.heartbeat("ghost", WorkerLoad()) is HeartbeatAction.REGISTER


def test_unknown_workers_are_refused_by_name():
    deployment, _, _ = make()
    for call in (deployment.drain, deployment.registry.get):
        with pytest.raises(UnknownWorker, match="unknown worker 'ghost'"):
            call("ghost")
    with pytest.raises(UnknownWorker):
        deployment.report_realized("ghost", PAGED, None)


def test_a_request_of_n_choices_counts_n_in_the_registry_all_or_none():
    deployment, _, _ = make("on")
    up(deployment)
    registry = deployment.registry
    assert registry.try_acquire("w0", 4, 3)
    assert not registry.try_acquire("w0", 4, 2)  # 3 + 2 > 4: none taken
    assert registry.get("w0").num_outstanding == 3
    registry.release("w0", 3)
    assert registry.get("w0").num_outstanding == 0


def test_drain_stops_routing_and_tells_the_worker_on_its_heartbeat():
    deployment, _, _ = make("on")
    up(deployment)
    assert deployment.registry.try_acquire("w0", 1)
    record = deployment.drain("w0", force=True)  # min_ready 1: only a forced drain
    assert record.state is WorkerState.DRAINING and record.num_outstanding == 1
    assert deployment.drain("w0").state is WorkerState.DRAINING  # idempotent
    assert not deployment.registry.try_acquire("w0", 10)
    assert deployment.heartbeat("w0", WorkerLoad()) is HeartbeatAction.DRAIN
    assert deployment.report_realized("w0", PAGED, None) is None
    assert state_of(deployment) is WorkerState.DRAINING  # a report does not undo a drain
    deployment.registry.release("w0")
    assert deployment.registry.get("w0").num_outstanding == 0
    assert not deployment.verdict().ready  # a draining worker is not counted


def test_a_rejected_worker_is_not_drained():
    deployment, _, _ = make("on")
    assert not deployment.register("w0", "w0:1", examples.mixed()).accepted
    assert deployment.drain("w0").state is WorkerState.REJECTED


def test_acquire_counts_only_ready_workers_up_to_the_limit():
    deployment, _, _ = make("on")
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    assert not deployment.registry.try_acquire("w0", 2)  # still loading
    assert report(deployment, resolution) is None
    assert deployment.registry.try_acquire("w0", 2)
    assert deployment.registry.try_acquire("w0", 2)
    assert not deployment.registry.try_acquire("w0", 2)
    assert deployment.registry.get("w0").num_outstanding == 2


def test_reasons_put_the_problem_first_and_list_each_fallback_once():
    deployment, _, _ = make("auto")
    up(deployment, capability=examples.cpu())
    reasons = deployment.registry.get("w0").reasons
    codes = [r.code for r in reasons]
    assert codes == [ReasonCode.AUTO_NOT_ENABLED_ON_DEVICE, ReasonCode.PAGED_CACHE_NOT_ENABLED]
    deployment.drain("w0", force=True)
    assert deployment.registry.get("w0").reasons[0].code is ReasonCode.WORKER_NOT_SERVING


def test_min_ready_counts_verified_replicas():
    deployment, _, _ = make("on", min_ready=2)
    up(deployment, "w0")
    verdict = deployment.verdict()
    assert deployment_state(verdict) is DeploymentState.PENDING
    assert verdict.reason.message == "1 of 2 required replicas verified"
    up(deployment, "w1")
    assert deployment.verdict().ready


def test_desired_state_refuses_impossible_counts():
    with pytest.raises(ValueError, match="min_ready must be at least 1"):
        DesiredState("d", None, KvBudget(), DEFAULT_AUTO_DEVICES, replicas=1, min_ready=0)


QUANTIZED_CPU = examples.cpu(
    weight_formats=(
        WeightFormatStatus(WeightFormat.INT8, True),
        WeightFormatStatus(WeightFormat.INT4, False, "torch lacks _weight_int4pack_mm_for_cpu"),
    )
)


def make_weights(weights):
    deployment, _, _ = make("auto")
    deployment.desired = replace(deployment.desired, weights=weights)
    return deployment


def test_an_explicit_weight_format_the_worker_cannot_hold_rejects_it_at_registration():
    deployment = make_weights(WeightFormat.INT4)
    resolution = deployment.register("w0", "w0:1", QUANTIZED_CPU)
    assert resolution.rejection.code is ReasonCode.WEIGHT_FORMAT_UNAVAILABLE
    assert state_of(deployment) is WorkerState.REJECTED
    assert deployment_state(deployment.verdict()) is DeploymentState.FAILED


def test_a_worker_holding_another_weight_format_than_resolved_is_not_counted_ready():
    deployment = make_weights(WeightFormat.INT8)
    resolution = deployment.register("w0", "w0:1", QUANTIZED_CPU)
    assert resolution.weights.format is WeightFormat.INT8
    honest = realized_for(None, resolution)
    dequantized = replace(honest, weight_format=WeightFormat.DEQUANTIZED)
    problem = deployment.report_realized("w0", dequantized, None)
    assert problem.code is ReasonCode.WEIGHT_FORMAT_MISMATCH
    assert state_of(deployment) is WorkerState.REJECTED
    # It registers again and reports what was resolved: now it counts.
    resolution = deployment.register("w0", "w0:1", QUANTIZED_CPU)
    assert deployment.report_realized("w0", realized_for(None, resolution), None) is None
    assert state_of(deployment) is WorkerState.READY


def make_scheduler(**intent):
    deployment, _, _ = make("auto")
    deployment.desired = replace(deployment.desired, scheduler=SchedulerIntent(**intent))
    return deployment


def test_a_worker_streaming_at_another_interval_than_the_manifest_is_not_counted_ready():
    deployment = make_scheduler(stream_interval=4)
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    honest = replace(realized_for(None, resolution), stream_interval=4)
    for reported, says in ((1, "sends 1 token per streamed message"), (0, "does not report one")):
        problem = deployment.report_realized("w0", replace(honest, stream_interval=reported), None)
        assert problem.code is ReasonCode.SCHEDULER_SETTING_MISMATCH
        assert "spec.scheduler.streamInterval is 4" in problem.message and says in problem.message
        assert state_of(deployment) is WorkerState.REJECTED
        assert deployment_state(deployment.verdict()) is not DeploymentState.READY
        deployment.register("w0", "w0:1", examples.cpu())  # it registers again
    assert deployment.report_realized("w0", honest, None) is None
    assert state_of(deployment) is WorkerState.READY


def test_a_worker_serving_another_max_model_len_than_the_manifest_is_not_counted_ready():
    deployment = make_scheduler(max_model_len=1024)
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    honest = replace(realized_for(None, resolution), max_model_len=1024)
    problem = deployment.report_realized("w0", replace(honest, max_model_len=2048), None)
    assert problem.code is ReasonCode.SCHEDULER_SETTING_MISMATCH
    assert "spec.scheduler.maxModelLen is 1024" in problem.message
    assert "2048" in problem.message
    deployment.register("w0", "w0:1", examples.cpu())
    assert deployment.report_realized("w0", honest, None) is None


def test_scheduler_settings_the_controller_was_not_given_are_not_checked():
    # A controller run on its own (workers started elsewhere) knows no scheduler settings.
    deployment, _, _ = make("auto")
    assert deployment.desired.scheduler == SchedulerIntent()
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    realized = replace(realized_for(None, resolution), stream_interval=7, max_model_len=99)
    assert deployment.report_realized("w0", realized, None) is None


def test_explain_names_the_scheduler_settings_each_worker_must_report():
    deployment = make_scheduler(stream_interval=4, max_model_len=1024)
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    realized = replace(realized_for(None, resolution), stream_interval=4, max_model_len=1024)
    assert deployment.report_realized("w0", realized, None) is None
    lines = explain(deployment.desired, deployment.registry.get("w0"), deployment.verdict())
    assert (
        "; scheduler streamInterval 4, maxModelLen 1024 (each worker must report them);"
        in (lines[0])
    )
    assert "4 tokens per streamed message" in next(x for x in lines if x.startswith("realized"))
    unchecked = make("auto")[0].desired
    assert (
        "scheduler"
        not in explain(unchecked, deployment.registry.get("w0"), deployment.verdict())[0]
    )
