"""The policy engine: the operator's intent held against what each worker reports.

Every decision is one of the pure `policy` functions; this class only applies them to the
registry: `resolve` at registration, `verify_report` on a realized report, `readiness` over all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from intentserve.controller.service.registry import Registry, WorkerLoad, WorkerRecord
from intentserve.controller.service.state import (
    DeploymentState,
    DesiredState,
    HeartbeatAction,
    WorkerState,
)
from intentserve.policy import (
    Capability,
    RealizedCache,
    Reason,
    Resolution,
    Verdict,
    WorkerReport,
    check_plausible,
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

    def now_s(self) -> float:
        return self._clock()

    def register(self, worker_id: str, address: str, capability: Capability) -> Resolution:
        """Resolve the intent for a (re)registering worker. A worker that cannot honour the
        policy is recorded REJECTED, and `resolution.rejection` says why."""
        self.registry.register(worker_id, address, capability, self._clock())
        resolution = resolve(self.desired.policy, capability, self.desired.auto_devices)
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
            problem = verify_report(self.desired.policy, realized) or check_plausible(
                realized, current.capability, self.desired.kv_budget
            )
        self.registry.realized(worker_id, realized, problem, self._clock())
        return problem

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> HeartbeatAction:
        return self.registry.heartbeat(worker_id, load, self._clock())

    def drain(self, worker_id: str) -> WorkerRecord:
        return self.registry.drain(worker_id)

    def mark_lost(self, timeout_s: float) -> tuple[WorkerRecord, ...]:
        return self.registry.mark_lost(self._clock(), timeout_s)

    def workers(self) -> tuple[WorkerRecord, ...]:
        return self.registry.snapshot()

    def verdict(self, workers: tuple[WorkerRecord, ...] | None = None) -> Verdict:
        records = self.workers() if workers is None else workers
        reports = [
            WorkerReport(
                r.worker_id,
                realized=r.realized,
                rejection=r.problem if r.state is WorkerState.REJECTED else None,
                serving=r.state is WorkerState.READY,
            )
            for r in records
        ]
        return readiness(self.desired.policy, reports, self.desired.min_ready)


def deployment_state(verdict: Verdict) -> DeploymentState:
    if verdict.ready:
        return DeploymentState.READY
    return DeploymentState.FAILED if verdict.failed else DeploymentState.PENDING
