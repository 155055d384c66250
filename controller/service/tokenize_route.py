"""Tokenize and Detokenize, routed: the tokenizer lives with the model, so the controller asks a
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
from intentserve.controller.service.channels import WorkerChannels
from intentserve.controller.service.deployment import Deployment
from intentserve.controller.service.errors import NotReady
from intentserve.controller.service.router import NO_READY_WORKER, upstream_failure
from intentserve.controller.service.state import WorkerState
from intentserve.v1 import inference_pb2_grpc

DEFAULT_TIMEOUT_S = 60.0


class TokenizeRoute:
    def __init__(self, deployment: Deployment, channels: WorkerChannels) -> None:
        self._deployment = deployment
        self._channels = channels
        self._turn = itertools.count()  # READY workers take turns

    async def tokenize(self, request, timeout_s: float | None):
        return await self._call("Tokenize", request, timeout_s)

    async def detokenize(self, request, timeout_s: float | None):
        return await self._call("Detokenize", request, timeout_s)

    async def _call(self, method: str, request: Message, timeout_s: float | None) -> Message:
        ready = [r for r in self._deployment.workers() if r.state is WorkerState.READY]
        if not ready:
            verdict = self._deployment.verdict()
            raise NotReady(verdict.reason if not verdict.ready else NO_READY_WORKER)
        record = ready[next(self._turn) % len(ready)]
        stub = inference_pb2_grpc.InferenceStub(
            self._channels.get(record.address, record.worker_id)
        )
        call = getattr(stub, method)
        try:
            return await asyncio.to_thread(call, request, timeout=timeout_s or DEFAULT_TIMEOUT_S)
        except grpc.RpcError as error:
            raise upstream_failure(record.worker_id, error, True, None) from None
