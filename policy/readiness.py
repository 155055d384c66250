"""The deployment readiness verdict over every worker's latest report."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from intentserve.policy.config import PagedAttentionConfig
from intentserve.policy.guard import RealizedCache, verify_report
from intentserve.policy.reasons import Reason, ReasonCode


class Availability(enum.Enum):
    """Whether the controller sends a worker requests, whatever its cache."""

    SERVING = "serving"  # receives requests (once its realized cache is verified)
    DRAINING = "draining"  # the operator took it out: its streams finish, no new ones start
    SUSPECT = "suspect"  # a stream or its connection broke: re-checked before it serves again
    LOST = "lost"  # silent past the heartbeat timeout, or its process is gone for good


# NOTE: out of service through a fault, not the operator's choice: these make a ready
# deployment DEGRADED.
FAULTS = frozenset({Availability.SUSPECT, Availability.LOST})
# NOTE: a rejection that says nothing of the policy: the report cannot be true, so the worker is
# broken or not what it claims. It is out of service as a fault (replaced within its restart
# budget) while the others serve; a report that can be true and breaks the policy fails the
# deployment.
UNTRUSTED = frozenset({ReasonCode.REALIZED_REPORT_IMPLAUSIBLE})


@dataclass(frozen=True)
class WorkerReport:
    """The controller's view of one worker, reduced to what the verdict needs."""

    worker_id: str
    realized: RealizedCache | None = None  # None until the worker has loaded and reported
    rejection: Reason | None = None  # set when the worker could not honour the policy
    availability: Availability = Availability.SERVING  # only SERVING counts toward readiness
    why: Reason | None = None  # why it is not SERVING, in the worker's own words


@dataclass(frozen=True)
class Verdict:
    ready: bool
    failed: bool  # some worker cannot honour a required (or `off`) policy
    degraded: bool  # ready, while some worker is out of service through a fault
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
    out_of_service: list[tuple[str, Reason]] = []
    faulty = False
    for report in reports:
        problem = report.rejection or (
            verify_report(policy, report.realized) if report.realized is not None else None
        )
        if problem is not None and problem.code in UNTRUSTED:
            out_of_service.append((report.worker_id, problem))
            faulty = True
        elif problem is not None:
            violations.append((report.worker_id, problem))
        elif report.availability is not Availability.SERVING:
            why = report.why or Reason(ReasonCode.WORKER_NOT_SERVING, report.availability.value)
            out_of_service.append((report.worker_id, why))
            faulty = faulty or report.availability in FAULTS
        elif report.realized is None:
            waiting.append(
                (
                    report.worker_id,
                    Reason(ReasonCode.WORKER_PENDING, "has not reported a realized cache yet"),
                )
            )
        else:
            num_verified += 1
    ready = not violations and num_verified >= min_ready
    not_serving = "".join(
        f"{'; not serving: ' if i == 0 else ', '}{worker_id} ({why.message})"
        for i, (worker_id, why) in enumerate(out_of_service)
    )
    if violations:
        worker_id, first = violations[0]
        reason = Reason(ReasonCode.POLICY_VIOLATION, f"worker {worker_id}: {first.message}")
    elif not ready:
        reason = Reason(
            ReasonCode.NOT_ENOUGH_REPLICAS,
            f"{num_verified} of {min_ready} required replicas verified{not_serving}",
        )
    else:
        code = ReasonCode.DEGRADED if faulty else ReasonCode.READY
        reason = Reason(
            code, f"{num_verified} replicas verified ({min_ready} required){not_serving}"
        )
    return Verdict(
        ready=ready,
        failed=bool(violations),
        degraded=ready and faulty,
        num_verified=num_verified,
        min_ready=min_ready,
        reason=reason,
        worker_reasons=tuple(violations + out_of_service + waiting),
    )
