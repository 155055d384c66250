"""The policy engine: the operator's intent held against what each worker reports.

Every decision is one of the pure `policy` functions; this class only applies them to the
registry: `resolve` at registration, `verify_report` on a realized report, `readiness` over all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from intentserve.controller.control.registry import (
    Registry,
    WorkerLoad,
    WorkerRecord,
    check_token,
)
from intentserve.controller.control.state import (
    DeploymentState,
    DesiredState,
    HeartbeatAction,
    WorkerState,
)
from intentserve.controller.errors import DrainRefused, NotThisRegistration, WorkerAlive
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

log = logging.getLogger(__name__)
IN_PROCESS = "in-process"  # the peer of a call made without gRPC (tests, embedding code)


class Deployment:
    def __init__(
        self,
        desired: DesiredState,
        *,
        heartbeat_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """`heartbeat_timeout_s`: how long a worker silent since its last call still counts as
        alive, so that no registration under its id takes its place."""
        self.desired = desired
        self.registry = Registry(on_change)
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._clock = clock
        self._drains = threading.Lock()  # one drain's check and act at a time

    def now_s(self) -> float:
        return self._clock()

    def register(
        self,
        worker_id: str,
        address: str,
        capability: Capability,
        *,
        token: bytes = b"",
        proof: bytes = b"",
        peer: str = IN_PROCESS,
    ) -> Resolution:
        """Resolve the intent for a (re)registering worker. A worker that cannot honour the
        policy is recorded REJECTED, and `resolution.rejection` says why. WorkerAlive while a
        worker of that id is alive, unless `proof` is the token of its live registration.
        `token`: what its reports and heartbeats must carry; `peer`: who called, for the log."""
        try:
            record = self.registry.register(
                worker_id,
                address,
                capability,
                self._clock(),
                token=token,
                alive_timeout_s=self._heartbeat_timeout_s,
                proof=proof,
            )
        except WorkerAlive as refused:
            log.warning("refused a registration of worker %s from %s: %s", worker_id, peer, refused)
            raise
        log.info(
            "worker %s registered from %s (serves on %s; registration %d)",
            worker_id,
            peer,
            address,
            record.num_registrations,
        )
        resolution = resolve(
            self.desired.policy, capability, self.desired.auto_devices, self.desired.weights
        )
        self.registry.resolve(worker_id, resolution)
        return resolution

    def report_realized(
        self,
        worker_id: str,
        realized: RealizedCache | None,
        load_error: Reason | None,
        *,
        token: bytes = b"",
        peer: str = IN_PROCESS,
    ) -> Reason | None:
        """Repeat the realized-state guard; the violation (or the load error), None if verified.
        NotThisRegistration when `token` is not the worker's current registration's."""
        try:
            problem = self._verify(worker_id, token, realized, load_error)
        except NotThisRegistration as refused:
            log.warning("refused a report for worker %s from %s: %s", worker_id, peer, refused)
            raise
        if problem is not None:
            log.warning("worker %s's report from %s is rejected: %s", worker_id, peer, problem)
        return problem

    def _verify(
        self,
        worker_id: str,
        token: bytes,
        realized: RealizedCache | None,
        load_error: Reason | None,
    ) -> Reason | None:
        current = self.registry.get(worker_id)
        check_token(current, token)
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
        self.registry.realized(worker_id, token, realized, problem, self._clock())
        return problem

    def heartbeat(
        self, worker_id: str, load: WorkerLoad, *, token: bytes = b"", peer: str = IN_PROCESS
    ) -> HeartbeatAction:
        """What the worker does next; REGISTER (nothing recorded) for a heartbeat with a token
        of another registration."""
        try:
            return self.registry.heartbeat(worker_id, token, load, self._clock())
        except NotThisRegistration as refused:
            log.warning("ignored a heartbeat for worker %s from %s: %s", worker_id, peer, refused)
            return HeartbeatAction.REGISTER

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
