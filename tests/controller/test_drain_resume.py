"""Operator actions end in a state someone acts on: a drain that would take the deployment below
min_ready is refused unless forced, and `resume` undoes a drain (the verified state is kept)."""

import pytest
from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import DeploymentState, HeartbeatAction, WorkerState
from intentserve.controller.errors import DrainRefused, UnknownWorker, WrongState
from intentserve.policy import ReasonCode, examples

from tests.controller.test_deployment import TIMEOUT_S, make, report, state_of, up


def two_ready(min_ready):
    deployment, clock, _ = make("on", min_ready=min_ready, replicas=2)
    up(deployment, "w0")
    up(deployment, "w1")
    assert deployment.verdict().ready
    return deployment, clock


def test_a_drain_below_min_ready_is_refused_and_changes_nothing():
    deployment, _ = two_ready(min_ready=2)
    with pytest.raises(DrainRefused) as refused:
        deployment.drain("w1")
    assert str(refused.value) == (
        "draining w1 would leave 1 of 2 required replicas verified (min_ready 2): "
        "the deployment would stop serving until it is resumed"
    )
    assert isinstance(refused.value, WrongState)  # FAILED_PRECONDITION on the wire
    assert state_of(deployment, "w1") is WorkerState.READY
    assert deployment.verdict().ready


def test_a_forced_drain_goes_below_min_ready_and_says_why_it_is_not_ready():
    deployment, _ = two_ready(min_ready=2)
    assert deployment.drain("w1", force=True).state is WorkerState.DRAINING
    verdict = deployment.verdict()
    assert deployment_state(verdict) is DeploymentState.PENDING
    assert verdict.reason.code is ReasonCode.NOT_ENOUGH_REPLICAS
    assert verdict.reason.message == (
        "1 of 2 required replicas verified; not serving: w1 (draining: receives no new requests)"
    )


def test_a_drain_that_keeps_min_ready_needs_no_force():
    deployment, _ = two_ready(min_ready=1)
    assert deployment.drain("w1").state is WorkerState.DRAINING
    assert deployment_state(deployment.verdict()) is DeploymentState.READY  # a choice, not a fault
    with pytest.raises(DrainRefused, match="would leave 0 of 1 required replicas"):
        deployment.drain("w0")


def test_draining_a_worker_that_is_not_counted_is_never_refused():
    deployment, _, _ = make("on", min_ready=2, replicas=2)
    up(deployment, "w0")
    deployment.register("w1", "w1:1", examples.cpu())  # loading: not counted yet
    assert deployment.drain("w1").state is WorkerState.DRAINING
    assert deployment.drain("w1").state is WorkerState.DRAINING  # idempotent


def test_resume_brings_a_drained_worker_back_verified():
    deployment, _ = two_ready(min_ready=2)
    deployment.drain("w1", force=True)
    assert deployment.heartbeat("w1", WorkerLoad()) is HeartbeatAction.DRAIN
    record = deployment.resume("w1")
    assert record.state is WorkerState.READY and record.realized is not None
    assert deployment.verdict().ready
    assert deployment.heartbeat("w1", WorkerLoad()) is HeartbeatAction.CONTINUE
    assert deployment.resume("w1").state is WorkerState.READY  # idempotent
    assert deployment.registry.try_acquire("w1", 1)  # routed to again


def test_resume_of_a_worker_drained_while_loading_waits_for_its_report():
    deployment, _, _ = make("on")
    resolution = deployment.register("w0", "w0:1", examples.cpu())
    deployment.drain("w0")
    assert deployment.resume("w0").state is WorkerState.LOADING
    assert report(deployment, resolution) is None
    assert state_of(deployment) is WorkerState.READY


def test_resume_refuses_a_lost_or_unknown_worker():
    deployment, clock, _ = make("on")
    up(deployment)
    clock.now_s += TIMEOUT_S * 2
    deployment.mark_lost(TIMEOUT_S)
    with pytest.raises(WrongState, match="'w0' is lost and cannot be resumed .register again"):
        deployment.resume("w0")
    with pytest.raises(UnknownWorker):
        deployment.resume("ghost")
