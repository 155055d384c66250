"""The router's gRPC servicers: `Inference`, each call handed to the (metered) router, and a
separate router's `Admin.Status`.
Errors are raised, never set here; `intentserve.controller.status_codes` turns them into status
codes. It runs on the gRPC server's event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
from intentserve.common.ids import new_request_id
from intentserve.common.streaming import GENERATE_MANY_ACCEPTED
from intentserve.controller.router import convert
from intentserve.controller.router.client_mux import ClientStreams
from intentserve.controller.router.request_metrics import MeteredRouter
from intentserve.controller.router.routing import Router
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.controller.router.watched import WatchedTable
from intentserve.v1 import admin_pb2_grpc, inference_pb2_grpc


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, router: Router | MeteredRouter, tokenizing: TokenizeRoute) -> None:
        """`router`: anything with `agenerate` (the server passes the metered one)."""
        self._router = router
        self._tokenizing = tokenizing

    async def Tokenize(self, request, context):
        return await self._tokenizing.tokenize(request, context.time_remaining())

    async def Detokenize(self, request, context):
        return await self._tokenizing.detokenize(request, context.time_remaining())

    async def Embed(self, request, context):
        if not request.request_id:
            request.request_id = new_request_id()
        return await self._tokenizing.embed(request, context.time_remaining())

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


class RouterAdminServicer(admin_pb2_grpc.AdminServicer):
    """A separate router's `status`: its readiness, the workers it routes to and its table's
    freshness. The rest of Admin belongs to the controller, and is refused naming it."""

    def __init__(self, deployment: str, table: WatchedTable) -> None:
        self._deployment = deployment
        self._table = table

    async def Status(self, request, context):
        table = self._table
        return convert.status_to_pb(
            self._deployment, table.readiness(), table.routes(), table.status()
        )

    async def Explain(self, request, context):
        await self._refuse(context, "explain")

    async def Drain(self, request, context):
        await self._refuse(context, "drain")

    async def Resume(self, request, context):
        await self._refuse(context, "resume")

    async def Shutdown(self, request, context):
        await self._refuse(context, "down")

    async def _refuse(self, context, command: str) -> None:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"this is a router: it answers status only; {command} goes to the controller at "
            f"{self._table.controller}",
        )
