"""The control plane's gRPC servicers (worker registry, admin): decode, call, encode. Errors are
raised, never set here; `intentserve.controller.status_codes` turns them into status codes.

They run on the grpc.aio server's event loop. Registry and Admin call the deployment's methods
directly: they are quick and lock-protected, so the loop is never held for long.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from intentserve.controller.control import convert
from intentserve.controller.control.deployment import Deployment, deployment_state
from intentserve.controller.control.explain import explain
from intentserve.controller.control.table_feed import TableFeed
from intentserve.v1 import admin_pb2, admin_pb2_grpc, worker_pb2_grpc

log = logging.getLogger(__name__)


class WorkerRegistryServicer(worker_pb2_grpc.WorkerRegistryServicer):
    def __init__(self, deployment: Deployment, heartbeat_interval_s: float) -> None:
        self._deployment = deployment
        self._heartbeat_interval_s = heartbeat_interval_s

    async def Register(self, request, context):
        worker_id, address, capability, proof = convert.register_from_pb(request)
        token = secrets.token_bytes(16)  # unguessable: only this registration's process holds it
        resolution = self._deployment.register(
            worker_id, address, capability, token=token, proof=proof, peer=context.peer()
        )
        return convert.register_to_pb(
            self._deployment.desired, resolution, self._heartbeat_interval_s, token
        )

    async def ReportRealized(self, request, context):
        worker_id, token, realized, load_error = convert.realized_report_from_pb(request)
        problem = self._deployment.report_realized(
            worker_id, realized, load_error, token=token, peer=context.peer()
        )
        return convert.verification_to_pb(problem)

    async def Heartbeat(self, request, context):
        worker_id, token, load = convert.heartbeat_from_pb(request)
        action = self._deployment.heartbeat(worker_id, load, token=token, peer=context.peer())
        return convert.heartbeat_to_pb(action)


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, deployment: Deployment, on_shutdown: Callable[[], None]) -> None:
        self._deployment = deployment
        self._on_shutdown = on_shutdown

    async def Status(self, request, context):
        workers = self._deployment.workers()
        verdict = self._deployment.verdict(workers)
        return convert.status_to_pb(
            self._deployment.desired,
            deployment_state(verdict),
            verdict,
            workers,
            self._deployment.now_s(),
        )

    async def Explain(self, request, context):
        record = self._deployment.registry.get(request.worker_id)
        lines = explain(self._deployment.desired, record, self._deployment.verdict())
        return convert.explain_to_pb(record, lines, self._deployment.now_s())

    async def Drain(self, request, context):
        record = self._deployment.drain(request.worker_id, force=request.force)
        return convert.drain_to_pb(record)

    async def Resume(self, request, context):
        return convert.resume_to_pb(self._deployment.resume(request.worker_id))

    async def Shutdown(self, request, context):
        self._on_shutdown()
        return admin_pb2.ShutdownResponse()


class WorkerTableServicer(admin_pb2_grpc.WorkerTableServicer):
    """Routers' watch of the verified worker table (who may call it: controller/auth.py)."""

    def __init__(self, feed: TableFeed) -> None:
        self._feed = feed

    async def Watch(self, request, context):
        log.info("router %r (%s) watches the worker table", request.router_id[:64], context.peer())
        async for event in self._feed.watch():
            yield convert.table_event_to_pb(event)
