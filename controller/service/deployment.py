"""The policy engine: the operator's intent held against what each worker reports.

Every decision is one of the pure `policy` functions; this class only applies them to the
registry: `resolve` at registration, `verify_report` on a realized report, `readiness` over all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from intentserve.controller.service.errors import DrainRefused
from intentserve.controller.service.registry import Registry, WorkerLoad, WorkerRecord
from intentserve.controller.service.state import (
    DeploymentState,
    DesiredState,
    HeartbeatAction,
    WorkerState,
)
from intentserve.policy import (
    Availability,
    Capability,
    RealizedCache,
    Reason,
    Resolution,
    Verdict,
    WorkerReport,
    check_plausible,
    check_scheduler,
    check_weight_format,
    readiness,
    resolve,
    verify_report,
)


class Deployment:
    def __init__(
        self,
        desired: DesiredState,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.desired = desired
        self.registry = Registry(on_change)
        self._clock = clock
        self._drains = threading.Lock()  # one drain's check and act at a time

    def now_s(self) -> float:
        return self._clock()

    def register(self, worker_id: str, address: str, capability: Capability) -> Resolution:
        """Resolve the intent for a (re)registering worker. A worker that cannot honour the
        policy is recorded REJECTED, and `resolution.rejection` says why."""
        self.registry.register(worker_id, address, capability, self._clock())
        resolution = resolve(
            self.desired.policy, capability, self.desired.auto_devices, self.desired.weights
        )
        self.registry.resolve(worker_id, resolution)
        return resolution

    def report_realized(
        self, worker_id: str, realized: RealizedCache | None, load_error: Reason | None
    ) -> Reason | None:
        """Repeat the realized-state guard; the violation (or the load error), None if verified."""
        current = self.registry.get(worker_id)
        if current.state is WorkerState.REJECTED:
            return current.problem  # it stays rejected until it registers again
        problem = load_error
        if problem is None:
            if realized is None:
                raise ValueError("realized: a report needs a realized state or a load_error")
            # The guard (the report against the policy), then the report against what the worker
            # said it can do and the budget: a report that cannot be true is a rejection too.
            problem = (
                verify_report(self.desired.policy, realized)
                or _check_weights(current.resolution, realized)
                or check_scheduler(self.desired.scheduler, realized)
                or check_plausible(realized, current.capability, self.desired.kv_budget)
            )
        self.registry.realized(worker_id, realized, problem, self._clock())
        return problem

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> HeartbeatAction:
        return self.registry.heartbeat(worker_id, load, self._clock())

    def drain(self, worker_id: str, *, force: bool = False) -> WorkerRecord:
        """Stop routing to a worker. Refused (DrainRefused) when it would leave fewer than
        min_ready verified replicas, unless `force`."""
        with self._drains:
            record = self.registry.get(worker_id)
            if not force and record.state is WorkerState.READY:
                drained = tuple(
                    replace(r, state=WorkerState.DRAINING) if r.worker_id == worker_id else r
                    for r in self.workers()
                )
                after = self.verdict(drained)
                min_ready = self.desired.min_ready
                if after.num_verified < min_ready:
                    raise DrainRefused(
                        f"draining {worker_id} would leave {after.num_verified} of {min_ready} "
                        f"required replicas verified (min_ready {min_ready}): the deployment "
                        "would stop serving until it is resumed"
                    )
            return self.registry.drain(worker_id)

    def resume(self, worker_id: str) -> WorkerRecord:
        """Undo a drain; its verified state is kept."""
        return self.registry.resume(worker_id)

    def suspect(self, worker_id: str, address: str, reason: Reason) -> WorkerRecord | None:
        """A stream to the worker at `address`, or its connection, broke: no request reaches it
        until `restore`. None when that worker is not READY there."""
        return self.registry.suspect(worker_id, address, reason, self._clock())

    def restore(self, worker_id: str) -> bool:
        """A suspect worker serves again once it has heartbeat since (the caller has seen its
        connection work again)."""
        return self.registry.restore(worker_id)

    def mark_dead(self, worker_id: str, reason: Reason) -> WorkerRecord:
        """Its process is gone for good (its restart budget is spent)."""
        return self.registry.lose(worker_id, reason)

    def mark_lost(self, timeout_s: float) -> tuple[WorkerRecord, ...]:
        return self.registry.mark_lost(self._clock(), timeout_s)

    def workers(self) -> tuple[WorkerRecord, ...]:
        return self.registry.snapshot()

    def verdict(self, workers: tuple[WorkerRecord, ...] | None = None) -> Verdict:
        records = self.workers() if workers is None else workers
        reports = [_report(r) for r in records]
        return readiness(self.desired.policy, reports, self.desired.min_ready)


def _check_weights(resolution: Resolution | None, realized: RealizedCache) -> Reason | None:
    """The weight format the worker holds against the one resolved for it at registration."""
    if resolution is None:
        raise ValueError("realized: the worker reported before it was resolved")
    return check_weight_format(resolution.weights, realized.weight_format)


# What the readiness verdict makes of a worker state; any other serves once verified.
_AVAILABILITY = {
    WorkerState.DRAINING: Availability.DRAINING,
    WorkerState.SUSPECT: Availability.SUSPECT,
    WorkerState.LOST: Availability.LOST,
}


def _report(record: WorkerRecord) -> WorkerReport:
    availability = _AVAILABILITY.get(record.state, Availability.SERVING)
    return WorkerReport(
        record.worker_id,
        realized=record.realized,
        rejection=record.problem if record.state is WorkerState.REJECTED else None,
        availability=availability,
        why=record.reasons[0] if availability is not Availability.SERVING else None,
    )


def deployment_state(verdict: Verdict) -> DeploymentState:
    if verdict.ready:
        return DeploymentState.DEGRADED if verdict.degraded else DeploymentState.READY
    return DeploymentState.FAILED if verdict.failed else DeploymentState.PENDING
