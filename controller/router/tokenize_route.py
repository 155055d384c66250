"""Tokenize and Detokenize, routed: the tokenizer lives with the model, so the router asks a
READY worker's Inference service (a unary call on the channel the router holds to it). No
generation slot is taken and nothing is queued: a tokenize is cheap, on the worker's server
threads, never on its engine loop. A worker's refusal passes through as a routed Generate's does
(INVALID_ARGUMENT with its BadRequest detail); no READY worker is NotReady with the verdict's
reason.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc
from google.protobuf.message import Message
from intentserve.controller.errors import NotReady
from intentserve.controller.router.channels import WorkerChannels
from intentserve.controller.router.table import WorkerTable
from intentserve.controller.router.upstream import NO_READY_WORKER, upstream_failure
from intentserve.v1 import inference_pb2_grpc

DEFAULT_TIMEOUT_S = 60.0


class TokenizeRoute:
    def __init__(self, table: WorkerTable, channels: WorkerChannels) -> None:
        self._table = table
        self._channels = channels
        self._turn = itertools.count()  # READY workers take turns

    async def tokenize(self, request, timeout_s: float | None):
        return await self._call("Tokenize", request, timeout_s)

    async def detokenize(self, request, timeout_s: float | None):
        return await self._call("Detokenize", request, timeout_s)

    async def _call(self, method: str, request: Message, timeout_s: float | None) -> Message:
        ready = self._table.routes()
        if not ready:
            readiness = self._table.readiness()
            raise NotReady(readiness.reason if not readiness.ready else NO_READY_WORKER)
        record = ready[next(self._turn) % len(ready)]
        stub = inference_pb2_grpc.InferenceStub(
            self._channels.get(record.address, record.worker_id)
        )
        call = getattr(stub, method)
        try:
            return await asyncio.to_thread(call, request, timeout=timeout_s or DEFAULT_TIMEOUT_S)
        except grpc.RpcError as error:
            raise upstream_failure(record.worker_id, error, True, None) from None
