"""The controller's protobuf boundary: requests decoded into plain values, results encoded.

Policy types go through `intentserve.convert` (shared with the worker); this module adds only the
controller's own messages: registration, verification, heartbeats, status, explain, drain and
resume.
"""

from __future__ import annotations

import enum

from intentserve import convert
from intentserve.controller.control.registry import WorkerLoad, WorkerRecord
from intentserve.controller.control.state import (
    DeploymentState,
    DesiredState,
    HeartbeatAction,
    WorkerState,
)
from intentserve.controller.control.table_feed import TableEvent
from intentserve.policy import (
    Capability,
    RealizedCache,
    Reason,
    Resolution,
    SchedulerIntent,
    Verdict,
)
from intentserve.v1 import admin_pb2, worker_pb2


def _to_pb(value: enum.Enum, pb_enum, prefix: str) -> int:
    """`WorkerState.READY` -> `WORKER_STATE_READY`: the prefix plus the member's name."""
    return pb_enum.Value(prefix + value.name)


def _required(value: str, field: str) -> str:
    if not value:
        raise ValueError(f"{field}: must not be empty")
    return value


def register_from_pb(msg: worker_pb2.RegisterRequest) -> tuple[str, str, Capability, bytes]:
    """The worker's id, address and capability, and the token proving its live registration
    (empty on a first registration)."""
    worker_id = _required(msg.worker_id, "worker_id")
    address = _required(msg.address, "address")
    if not msg.HasField("capability"):
        raise ValueError("capability: must be set")
    capability = convert.capability_from_pb(msg.capability)
    return worker_id, address, capability, msg.registration_token


def register_to_pb(
    desired: DesiredState, resolution: Resolution, heartbeat_interval_s: float, token: bytes
) -> worker_pb2.RegisterResponse:
    """The resolved config, or the rejection as a structured reason; the registration's token."""
    response = worker_pb2.RegisterResponse(
        heartbeat_interval_s=heartbeat_interval_s, registration_token=token
    )
    if resolution.rejection is not None:
        response.rejection.CopyFrom(convert.reason_to_pb(resolution.rejection))
    else:
        response.config.CopyFrom(
            convert.resolution_to_pb(desired.policy, resolution, desired.kv_budget)
        )
    return response


def realized_report_from_pb(
    msg: worker_pb2.RealizedReport,
) -> tuple[str, bytes, RealizedCache | None, Reason | None]:
    worker_id = _required(msg.worker_id, "worker_id")
    load_error = convert.reason_from_pb(msg.load_error) if msg.HasField("load_error") else None
    realized = convert.realized_from_pb(msg.realized) if msg.HasField("realized") else None
    if realized is None and load_error is None:
        raise ValueError("realized: must be set (or load_error)")
    return worker_id, msg.registration_token, realized, load_error


def verification_to_pb(problem: Reason | None) -> worker_pb2.Verification:
    if problem is None:
        return worker_pb2.Verification(verified=True)
    return worker_pb2.Verification(verified=False, reason=convert.reason_to_pb(problem))


def heartbeat_from_pb(msg: worker_pb2.HeartbeatRequest) -> tuple[str, bytes, WorkerLoad]:
    load = WorkerLoad(
        msg.num_running,
        msg.num_waiting,
        msg.num_kv_used,
        msg.num_kv_total,
        msg.num_preemptions,
        msg.num_prefix_queried_tokens,
        msg.num_prefix_hit_tokens,
        msg.num_steps,
        msg.total_step_s,
        msg.num_step_seqs,
    )
    return _required(msg.worker_id, "worker_id"), msg.registration_token, load


def heartbeat_to_pb(action: HeartbeatAction) -> worker_pb2.HeartbeatResponse:
    return worker_pb2.HeartbeatResponse(
        action=_to_pb(action, worker_pb2.HeartbeatAction, "HEARTBEAT_ACTION_")
    )


def worker_status_to_pb(record: WorkerRecord, now_s: float) -> admin_pb2.WorkerStatus:
    msg = admin_pb2.WorkerStatus(
        worker_id=record.worker_id,
        address=record.address,
        state=_to_pb(record.state, admin_pb2.WorkerState, "WORKER_STATE_"),
        device_kind=convert.device_kind_to_pb(record.capability.device_kind),
        reasons=[convert.reason_to_pb(r) for r in record.reasons],
        num_outstanding=record.num_outstanding,
        num_kv_used=record.load.num_kv_used,
        num_kv_total=record.load.num_kv_total,
        last_heartbeat_age_s=max(now_s - record.last_seen_s, 0.0),
    )
    if record.resolution is not None:
        msg.decisions.extend(convert.decision_to_pb(d) for d in record.resolution.decisions)
    if record.realized is not None:
        msg.realized.CopyFrom(convert.realized_to_pb(record.realized))
    return msg


def status_to_pb(
    desired: DesiredState,
    state: DeploymentState,
    verdict: Verdict,
    workers: tuple[WorkerRecord, ...],
    now_s: float,
) -> admin_pb2.StatusResponse:
    return admin_pb2.StatusResponse(
        deployment=desired.deployment,
        state=_to_pb(state, admin_pb2.DeploymentState, "DEPLOYMENT_STATE_"),
        reason=convert.reason_to_pb(verdict.reason),
        policy=convert.policy_to_pb(desired.policy),
        kv_budget=convert.kv_budget_to_pb(desired.kv_budget),
        weights=convert.weight_format_to_pb(desired.weights),
        scheduler=_scheduler_to_pb(desired.scheduler),
        min_ready=verdict.min_ready,
        num_verified=verdict.num_verified,
        workers=[worker_status_to_pb(r, now_s) for r in workers],
    )


def _scheduler_to_pb(intent: SchedulerIntent) -> admin_pb2.SchedulerSettings | None:
    """The settings checked; None (the field unset) where none is."""
    if not intent.checks_any:
        return None
    return admin_pb2.SchedulerSettings(
        stream_interval=intent.stream_interval, max_model_len=intent.max_model_len
    )


def explain_to_pb(
    record: WorkerRecord, lines: list[str], now_s: float
) -> admin_pb2.ExplainResponse:
    return admin_pb2.ExplainResponse(
        worker_id=record.worker_id, lines=lines, worker=worker_status_to_pb(record, now_s)
    )


def drain_to_pb(record: WorkerRecord) -> admin_pb2.DrainResponse:
    return admin_pb2.DrainResponse(
        state=_to_pb(record.state, admin_pb2.WorkerState, "WORKER_STATE_"),
        num_outstanding=record.num_outstanding,
    )


def resume_to_pb(record: WorkerRecord) -> admin_pb2.ResumeResponse:
    return admin_pb2.ResumeResponse(
        state=_to_pb(record.state, admin_pb2.WorkerState, "WORKER_STATE_"),
        num_outstanding=record.num_outstanding,
    )


def worker_state_from_pb(number: int) -> WorkerState:
    """For clients (the admin CLI, tests) that read a status back."""
    return WorkerState[admin_pb2.WorkerState.Name(number).removeprefix("WORKER_STATE_")]


def deployment_state_from_pb(number: int) -> DeploymentState:
    return DeploymentState[admin_pb2.DeploymentState.Name(number).removeprefix("DEPLOYMENT_STATE_")]


def table_event_to_pb(event: TableEvent) -> admin_pb2.WorkerTableEvent:
    readiness = event.readiness
    return admin_pb2.WorkerTableEvent(
        revision=event.revision,
        snapshot=event.snapshot,
        workers=[
            admin_pb2.TableWorker(
                worker_id=w.worker_id,
                address=w.address,
                state=_to_pb(w.state, admin_pb2.WorkerState, "WORKER_STATE_"),
                max_num_seqs=w.max_num_seqs,
                revision=w.revision,
                max_model_len=w.max_model_len,
                task=w.task,
            )
            for w in event.workers
        ],
        removed_worker_ids=event.removed_worker_ids,
        ready=readiness.ready,
        state=_to_pb(readiness.state, admin_pb2.DeploymentState, "DEPLOYMENT_STATE_"),
        reason=convert.reason_to_pb(readiness.reason),
        keepalive_s=event.keepalive_s,
        controller_id=event.controller_id,
    )
