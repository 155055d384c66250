"""The controller's gRPC servicers: decode, call, encode. Errors are raised, never set here;
`intentserve.controller.service.interceptor` turns them into status codes.

They run on the grpc.aio server's event loop. Registry and Admin call the deployment's methods
directly: they are quick and lock-protected, so the loop is never held for long.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable

from intentserve.controller.service import convert
from intentserve.controller.service.client_mux import ClientStreams
from intentserve.controller.service.deployment import Deployment, deployment_state
from intentserve.controller.service.explain import explain
from intentserve.controller.service.request_metrics import MeteredRouter
from intentserve.controller.service.router import Router
from intentserve.controller.service.tokenize_route import TokenizeRoute
from intentserve.streaming import GENERATE_MANY_ACCEPTED
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2_grpc, worker_pb2_grpc


class WorkerRegistryServicer(worker_pb2_grpc.WorkerRegistryServicer):
    def __init__(self, deployment: Deployment, heartbeat_interval_s: float) -> None:
        self._deployment = deployment
        self._heartbeat_interval_s = heartbeat_interval_s

    async def Register(self, request, context):
        worker_id, address, capability = convert.register_from_pb(request)
        token = secrets.token_bytes(16)  # unguessable: only this registration's process holds it
        resolution = self._deployment.register(
            worker_id, address, capability, token=token, peer=context.peer()
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


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, router: Router | MeteredRouter, tokenizing: TokenizeRoute) -> None:
        """`router`: anything with `agenerate` (the server passes the metered one)."""
        self._router = router
        self._tokenizing = tokenizing

    async def Tokenize(self, request, context):
        return await self._tokenizing.tokenize(request, context.time_remaining())

    async def Detokenize(self, request, context):
        return await self._tokenizing.detokenize(request, context.time_remaining())

    async def Generate(self, request, context) -> AsyncIterator:
        async with contextlib.aclosing(self._router.agenerate(request, context)) as responses:
            async for response in responses:
                yield response

    async def GenerateMany(self, request_iterator, context) -> AsyncIterator:
        await context.send_initial_metadata((GENERATE_MANY_ACCEPTED,))
        served = ClientStreams(self._router).serve(request_iterator)
        async with contextlib.aclosing(served) as messages:
            async for message in messages:
                yield message


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
