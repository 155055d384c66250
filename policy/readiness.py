"""The deployment readiness verdict over every worker's latest report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from intentserve.policy.config import PagedAttentionConfig
from intentserve.policy.guard import RealizedCache, verify_report
from intentserve.policy.reasons import Reason, ReasonCode


@dataclass(frozen=True)
class WorkerReport:
    """The controller's view of one worker, reduced to what the verdict needs."""

    worker_id: str
    realized: RealizedCache | None = None  # None until the worker has loaded and reported
    rejection: Reason | None = None  # set when the worker could not honour the policy
    serving: bool = True  # False while lost or draining: it is not counted toward readiness


@dataclass(frozen=True)
class Verdict:
    ready: bool
    failed: bool  # some worker cannot honour a required (or `off`) policy
    num_verified: int
    min_ready: int
    reason: Reason
    worker_reasons: tuple[tuple[str, Reason], ...]  # per worker: why it is not (yet) verified


def readiness(
    policy: PagedAttentionConfig | None, reports: Sequence[WorkerReport], min_ready: int
) -> Verdict:
    """Ready when `min_ready` workers are verified and none disagrees with the policy."""
    if min_ready < 1:
        raise ValueError(f"min_ready must be at least 1, got {min_ready}")
    num_verified = 0
    violations: list[tuple[str, Reason]] = []
    waiting: list[tuple[str, Reason]] = []
    for report in reports:
        problem = report.rejection or (
            verify_report(policy, report.realized) if report.realized is not None else None
        )
        if problem is not None:
            violations.append((report.worker_id, problem))
        elif report.realized is None:
            waiting.append(
                (
                    report.worker_id,
                    Reason(ReasonCode.WORKER_PENDING, "has not reported a realized cache yet"),
                )
            )
        elif not report.serving:
            waiting.append(
                (report.worker_id, Reason(ReasonCode.WORKER_NOT_SERVING, "is lost or draining"))
            )
        else:
            num_verified += 1
    if violations:
        worker_id, first = violations[0]
        reason = Reason(ReasonCode.POLICY_VIOLATION, f"worker {worker_id}: {first.message}")
    elif num_verified < min_ready:
        reason = Reason(
            ReasonCode.NOT_ENOUGH_REPLICAS,
            f"{num_verified} of {min_ready} required replicas verified",
        )
    else:
        reason = Reason(ReasonCode.READY, f"{num_verified} replicas verified")
    return Verdict(
        ready=not violations and num_verified >= min_ready,
        failed=bool(violations),
        num_verified=num_verified,
        min_ready=min_ready,
        reason=reason,
        worker_reasons=tuple(violations + waiting),
    )
