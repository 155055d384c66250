"""What `intentserve up` makes of a worker whose actor Ray reports DEAD: one that died with its
restart budget (`spec.maxRestarts`) spent, and will never register again.

The controller records it (LOST, with the budget and Ray's last error as the reason), so that
status and health say so at once. While the workers left can still meet minReady, the deployment
keeps serving and reads DEGRADED; once they cannot, `up` exits 1 naming each dead worker and its
last error.

Decision: exit, rather than replace the actor with a fresh budget. The budget is what stops a
crash loop (a model that cannot load, a node out of memory); renewing it inside `up` would loop
out of sight. A supervisor (systemd, Kubernetes, a shell loop) sees the exit, counts it, backs
off and alerts, and starts the whole deployment again from a clean state.
"""

from __future__ import annotations

from intentserve.controller.control.deployment import Deployment
from intentserve.controller.errors import UnknownWorker
from intentserve.controller.launch.types import ActorProbe, ActorState
from intentserve.policy import Reason, ReasonCode


def dead_actors(probes: dict[str, ActorProbe]) -> dict[str, str]:
    """worker id -> Ray's last error, for every actor dead for good."""
    return {w: p.error for w, p in probes.items() if p.state is ActorState.DEAD}


def dead_reason(error: str, max_restarts: int) -> Reason:
    return Reason(
        ReasonCode.WORKER_NOT_SERVING,
        f"dead: its restart budget is spent (spec.maxRestarts {max_restarts}): {error}",
    )


def record_dead(deployment: Deployment, dead: dict[str, str], max_restarts: int) -> None:
    """Tell the controller (idempotent); a worker that died before registering is not known."""
    for worker_id, error in dead.items():
        try:
            deployment.mark_dead(worker_id, dead_reason(error, max_restarts))
        except UnknownWorker:
            continue


def supervise(
    deployment: Deployment, probes: dict[str, ActorProbe], max_restarts: int
) -> str | None:
    """Record the dead actors; the error to exit with once minReady can no longer be met."""
    dead = dead_actors(probes)
    record_dead(deployment, dead, max_restarts)
    desired = deployment.desired
    return budget_failure(
        dead, replicas=desired.replicas, min_ready=desired.min_ready, max_restarts=max_restarts
    )


def budget_failure(
    dead: dict[str, str], *, replicas: int, min_ready: int, max_restarts: int
) -> str | None:
    """The error `up` exits with once minReady can no longer be met; None while it can."""
    num_left = replicas - len(dead)
    if num_left >= min_ready:
        return None
    lines = [
        f"spec.minReady {min_ready} can no longer be met: {num_left} of {replicas} replicas can "
        f"still run; the restart budget (spec.maxRestarts {max_restarts}) of each of these is "
        "spent:"
    ]
    lines += [f"  {worker_id}: {dead[worker_id]}" for worker_id in sorted(dead)]
    return "\n".join(lines)
