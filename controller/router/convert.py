"""The router's side of the protobuf boundary: the controller's watch events in, its status out.
The rest of the router never touches `admin_pb2`."""

from __future__ import annotations

from intentserve import convert
from intentserve.controller.router.table import Readiness, Route
from intentserve.controller.router.watched import (
    EntryState,
    Freshness,
    TableEntry,
    TableStatus,
    TableUpdate,
)
from intentserve.v1 import admin_pb2

_READY = admin_pb2.WORKER_STATE_READY
_ENTRY_STATES = {
    _READY: EntryState.READY,
    admin_pb2.WORKER_STATE_REGISTERED: EntryState.VERIFYING,
    admin_pb2.WORKER_STATE_LOADING: EntryState.VERIFYING,
    admin_pb2.WORKER_STATE_REJECTED: EntryState.OUT,
    admin_pb2.WORKER_STATE_DRAINING: EntryState.OUT,
    admin_pb2.WORKER_STATE_SUSPECT: EntryState.OUT,
    admin_pb2.WORKER_STATE_LOST: EntryState.LOST,
}  # NOTE: a state this router does not know is OUT: nothing new is routed to it
_FRESHNESS = {
    Freshness.FRESH: admin_pb2.TABLE_FRESHNESS_FRESH,
    Freshness.STALE: admin_pb2.TABLE_FRESHNESS_STALE,
    Freshness.EXPIRED: admin_pb2.TABLE_FRESHNESS_EXPIRED,
}


def table_update_from_pb(msg: admin_pb2.WorkerTableEvent) -> TableUpdate:
    return TableUpdate(
        revision=msg.revision,
        snapshot=msg.snapshot,
        workers=tuple(
            TableEntry(
                w.worker_id,
                w.address,
                _ENTRY_STATES.get(w.state, EntryState.OUT),
                max_num_seqs=w.max_num_seqs,
                revision=w.revision,
                max_model_len=w.max_model_len,
                task=w.task or "generate",
            )
            for w in msg.workers
        ),
        removed_worker_ids=tuple(msg.removed_worker_ids),
        readiness=Readiness(msg.ready, convert.reason_from_pb(msg.reason)),
        keepalive_s=msg.keepalive_s,
        controller_id=msg.controller_id,
        pending=msg.state == admin_pb2.DEPLOYMENT_STATE_PENDING,
    )


def router_status_to_pb(status: TableStatus) -> admin_pb2.RouterStatus:
    return admin_pb2.RouterStatus(
        controller=status.controller,
        revision=status.revision,
        freshness=_FRESHNESS[status.freshness],
        stale_for_s=status.stale_for_s,
        max_stale_s=status.max_stale_s,
    )


def status_to_pb(
    deployment: str, readiness: Readiness, routes: tuple[Route, ...], status: TableStatus
) -> admin_pb2.StatusResponse:
    """What a separate router answers `status` with: its readiness, the workers it routes to
    (with its own requests on each) and its table's freshness."""
    return admin_pb2.StatusResponse(
        deployment=deployment,
        state=admin_pb2.DEPLOYMENT_STATE_READY
        if readiness.ready
        else admin_pb2.DEPLOYMENT_STATE_PENDING,
        reason=convert.reason_to_pb(readiness.reason),
        num_verified=len(routes),
        workers=[
            admin_pb2.WorkerStatus(
                worker_id=r.worker_id,
                address=r.address,
                state=_READY,
                num_outstanding=r.num_outstanding,
            )
            for r in routes
        ],
        router=router_status_to_pb(status),
    )
