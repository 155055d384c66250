"""The router's gRPC servicer, `Inference`: thin, each call handed to the (metered) router.
Errors are raised, never set here; `intentserve.controller.status_codes` turns them into status
codes. It runs on the gRPC server's event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from intentserve.controller.router.client_mux import ClientStreams
from intentserve.controller.router.request_metrics import MeteredRouter
from intentserve.controller.router.routing import Router
from intentserve.streaming import GENERATE_MANY_ACCEPTED
from intentserve.v1 import inference_pb2_grpc


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, router: Router | MeteredRouter) -> None:
        """`router`: anything with `agenerate` (the server passes the metered one)."""
        self._router = router

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
