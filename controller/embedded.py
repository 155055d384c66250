"""The embedded router's worker table and HTTP view: the control plane's registry and verdict,
read in the same process.

`up` runs the controller and one router in one process; this is the one place where the two
meet. The router sees the controller's verdict the moment it changes (no watch stream in
between), counts its requests in the registry (so `status` and `drain` show them) and reports
a broken stream by making the worker SUSPECT there, as a separate router's table does for its
own routing (router/watched.py).
"""

from __future__ import annotations

from intentserve.controller.control.deployment import Deployment, deployment_state
from intentserve.controller.control.metrics import realized_labels
from intentserve.controller.control.reconcile import Reconciler
from intentserve.controller.control.state import DeploymentState, WorkerState
from intentserve.controller.router.table import Readiness, Route
from intentserve.controller.router.view import Health, Realized
from intentserve.policy import Reason


class EmbeddedTable:
    """A `router.table.WorkerTable` over the controller's `Deployment`."""

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment

    def readiness(self) -> Readiness:
        verdict = self._deployment.verdict()
        return Readiness(verdict.ready, verdict.reason)

    def routes(self) -> tuple[Route, ...]:
        return tuple(
            Route(
                r.worker_id,
                r.address,
                r.realized.max_num_seqs,
                r.num_outstanding,
                max_model_len=r.realized.max_model_len,
                task=r.realized.task,
            )
            for r in self._deployment.workers()
            if r.state is WorkerState.READY and r.realized is not None
        )

    def try_acquire(self, worker_id: str, max_outstanding: int, num: int = 1) -> bool:
        return self._deployment.registry.try_acquire(worker_id, max_outstanding, num)

    def release(self, worker_id: str, num: int = 1) -> None:
        self._deployment.registry.release(worker_id, num)

    def suspect(self, worker_id: str, address: str, reason: Reason) -> bool:
        return self._deployment.suspect(worker_id, address, reason) is not None


class EmbeddedView:
    """A `router.view.DeploymentView` over the controller's published verdict (what its gRPC
    health says) and registry (the realized reports)."""

    def __init__(self, deployment: Deployment, reconciler: Reconciler) -> None:
        self._deployment = deployment
        self._reconciler = reconciler

    def health(self) -> Health:
        verdict = self._reconciler.verdict
        state = deployment_state(verdict)
        return Health(state is DeploymentState.READY, state.value, verdict.reason)

    def realized(self) -> list[Realized]:
        policy = self._deployment.desired.policy
        return [
            Realized(
                w.realized.max_model_len, {"worker_id": w.worker_id, **realized_labels(policy, w)}
            )
            for w in self._deployment.workers()
            if w.realized is not None
        ]
