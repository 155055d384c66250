"""What `up` makes of actors whose restart budget is spent: it keeps serving while the others can
still meet minReady, and otherwise exits naming each dead worker and its last error."""

from intentserve.controller.cli.supervise import budget_failure, dead_actors, dead_reason
from intentserve.controller.launch.types import ActorProbe, ActorState
from intentserve.policy import ReasonCode

DEAD = ActorProbe(ActorState.DEAD, error="The actor died: killed by ray.kill")
RUNNING = ActorProbe(ActorState.RUNNING, {"phase": "serving"})


def test_only_dead_actors_count():
    probes = {
        "w-0": RUNNING,
        "w-1": DEAD,
        "w-2": ActorProbe(ActorState.RESTARTING),
        "w-3": ActorProbe(ActorState.STARTING),
    }
    assert dead_actors(probes) == {"w-1": "The actor died: killed by ray.kill"}


def test_while_min_ready_can_be_met_up_keeps_serving():
    assert budget_failure({}, replicas=2, min_ready=2, max_restarts=3) is None
    assert budget_failure({"w-1": "gone"}, replicas=2, min_ready=1, max_restarts=3) is None


def test_once_min_ready_cannot_be_met_the_failure_names_every_dead_worker():
    dead = {"w-1": "segfault", "w-0": "killed"}
    assert budget_failure(dead, replicas=3, min_ready=2, max_restarts=3) == (
        "spec.minReady 2 can no longer be met: 1 of 3 replicas can still run; "
        "the restart budget (spec.maxRestarts 3) of each of these is spent:\n"
        "  w-0: killed\n"
        "  w-1: segfault"
    )


def test_the_dead_reason_the_controller_records_names_the_budget_and_the_error():
    reason = dead_reason("killed", max_restarts=0)
    assert reason.code is ReasonCode.WORKER_NOT_SERVING
    assert reason.message == "dead: its restart budget is spent (spec.maxRestarts 0): killed"
