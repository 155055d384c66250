"""A broken stream or connection makes a worker SUSPECT at once: routing stops and readiness is
re-evaluated without waiting for the heartbeat timeout; a heartbeat over a working connection
restores it. A worker whose process is gone for good is DEGRADED's reason while min_ready holds."""

from intentserve.controller.control.deployment import deployment_state
from intentserve.controller.control.registry import WorkerLoad
from intentserve.controller.control.state import DeploymentState, HeartbeatAction, WorkerState
from intentserve.policy import Reason, ReasonCode

from tests.controller.test_deployment import TIMEOUT_S, make, state_of, up

BROKE = Reason(ReasonCode.WORKER_NOT_SERVING, "suspect: its stream broke mid-stream")


def test_a_suspect_worker_receives_nothing_and_readiness_follows_at_once():
    deployment, _, changes = make("on", min_ready=1)
    up(deployment)
    changes.clear()
    record = deployment.suspect("w0", "w0:1", BROKE)
    assert record.state is WorkerState.SUSPECT and record.problem == BROKE
    assert changes  # the reconcile loop is woken: health follows without a tick
    assert not deployment.registry.try_acquire("w0", 10)
    verdict = deployment.verdict()
    assert deployment_state(verdict) is DeploymentState.PENDING
    assert verdict.reason.message == (
        "0 of 1 required replicas verified; not serving: w0 (suspect: its stream broke mid-stream)"
    )
    assert deployment.heartbeat("w0", WorkerLoad()) is HeartbeatAction.CONTINUE


def test_only_a_ready_worker_at_that_address_becomes_suspect():
    deployment, _, _ = make("on")
    up(deployment)
    assert deployment.suspect("w0", "w0:old", BROKE) is None  # an earlier incarnation's address
    assert deployment.suspect("ghost", "ghost:1", BROKE) is None
    deployment.drain("w0", force=True)
    assert deployment.suspect("w0", "w0:1", BROKE) is None
    assert state_of(deployment) is WorkerState.DRAINING


def test_a_heartbeat_after_the_suspicion_restores_it():
    deployment, clock, _ = make("on")
    up(deployment)
    deployment.suspect("w0", "w0:1", BROKE)
    assert not deployment.restore("w0")  # no sign of life since
    clock.now_s += 0.1
    deployment.heartbeat("w0", WorkerLoad())
    assert deployment.restore("w0")
    record = deployment.registry.get("w0")
    assert (record.state, record.problem) == (WorkerState.READY, None)
    assert deployment.verdict().ready
    assert not deployment.restore("w0")  # only a suspect is restored


def test_a_suspect_that_stays_silent_becomes_lost():
    deployment, clock, _ = make("on")
    up(deployment)
    deployment.suspect("w0", "w0:1", BROKE)
    clock.now_s += TIMEOUT_S * 2
    (lost,) = deployment.mark_lost(TIMEOUT_S)
    assert lost.worker_id == "w0" and lost.state is WorkerState.LOST


def test_degraded_while_min_ready_holds_with_a_worker_suspect_or_dead():
    deployment, _, _ = make("on", min_ready=1, replicas=2)
    up(deployment, "w0")
    up(deployment, "w1")
    deployment.suspect("w1", "w1:1", BROKE)
    verdict = deployment.verdict()
    assert verdict.ready and deployment_state(verdict) is DeploymentState.DEGRADED
    assert verdict.reason.code is ReasonCode.DEGRADED
    dead = Reason(ReasonCode.WORKER_NOT_SERVING, "dead: its restart budget is spent: killed")
    assert deployment.mark_dead("w1", dead).state is WorkerState.LOST
    verdict = deployment.verdict()
    assert deployment_state(verdict) is DeploymentState.DEGRADED
    assert verdict.reason.message == (
        "1 replicas verified (1 required); not serving: w1 (dead: its restart budget is spent: "
        "killed)"
    )
    assert deployment.heartbeat("w1", WorkerLoad()) is HeartbeatAction.REGISTER
