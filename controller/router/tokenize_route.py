"""Tokenize, Detokenize and Embed, routed: the tokenizer lives with the model, so the router asks a
READY worker's Inference service (a unary call on the channel the router holds to it). No
generation slot is taken and nothing is queued: a tokenize is cheap, on the worker's server
threads, never on its engine loop. Embed goes to a READY worker whose model embeds (an encoder
worker bounds its own calls, and refuses past them RESOURCE_EXHAUSTED). A worker's refusal
passes through as a routed Generate's does (INVALID_ARGUMENT with its BadRequest detail); no
READY worker is NotReady with the verdict's reason.

A request is checked before it is sent (request_size.py: bytes, turns, tools, nesting, and
characters or ids against the largest max_model_len a READY worker reported). A reply over the
router's receive limit (REPLY_LIMIT_BYTES) is refused naming what made it, never a 429 that
invites the same request again.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc
from google.protobuf.message import Message
from intentserve.controller.errors import NotReady, RequestTooLarge
from intentserve.controller.router.channels import WorkerChannels
from intentserve.controller.router.request_size import check_detokenize, check_request
from intentserve.controller.router.table import (
    EMBED,
    Route,
    WorkerTable,
    longest_served,
    refuse_other_task,
)
from intentserve.controller.router.upstream import NO_READY_WORKER, upstream_failure
from intentserve.v1 import inference_pb2_grpc

DEFAULT_TIMEOUT_S = 60.0
# What the router's channels to the workers take in one message (grpc's default).
REPLY_LIMIT_BYTES = 4 << 20


class TokenizeRoute:
    def __init__(self, table: WorkerTable, channels: WorkerChannels) -> None:
        self._table = table
        self._channels = channels
        self._turn = itertools.count()  # READY workers take turns

    async def tokenize(self, request, timeout_s: float | None):
        ready = self._ready()
        check_request(request, longest_served(ready))
        made_by = "messages" if request.messages else "prompt"
        return await self._call(ready, "Tokenize", request, timeout_s, made_by)

    async def detokenize(self, request, timeout_s: float | None):
        ready = self._ready()
        check_detokenize(request, longest_served(ready))
        return await self._call(ready, "Detokenize", request, timeout_s, "tokens")

    async def embed(self, request, timeout_s: float | None):
        """An EmbedRequest, to a READY worker whose model embeds (WrongTask when the
        deployment's workers generate)."""
        ready = self._ready()
        refuse_other_task(ready, EMBED)
        embedding = tuple(r for r in ready if r.task == EMBED)
        made_by = "texts" if request.texts else "token_inputs"
        return await self._call(embedding, "Embed", request, timeout_s, made_by)

    def _ready(self) -> tuple[Route, ...]:
        ready = self._table.routes()
        if not ready:
            readiness = self._table.readiness()
            raise NotReady(readiness.reason if not readiness.ready else NO_READY_WORKER)
        return ready

    async def _call(
        self,
        ready: tuple[Route, ...],
        method: str,
        request: Message,
        timeout_s: float | None,
        made_by: str,
    ) -> Message:
        """`made_by`: the request's field a reply too large to take is refused naming."""
        record = ready[next(self._turn) % len(ready)]
        stub = inference_pb2_grpc.InferenceStub(
            self._channels.get(record.address, record.worker_id)
        )
        call = getattr(stub, method)
        try:
            return await asyncio.to_thread(call, request, timeout=timeout_s or DEFAULT_TIMEOUT_S)
        except grpc.RpcError as error:
            if _reply_too_large(error):
                raise RequestTooLarge(
                    made_by,
                    f"its reply is over the {REPLY_LIMIT_BYTES} bytes a router takes from a "
                    f"worker in one message; allowed: a reply of at most {REPLY_LIMIT_BYTES} "
                    "bytes (send it in parts)",
                ) from None
            raise upstream_failure(record.worker_id, error, True, None) from None


def _reply_too_large(error: grpc.RpcError) -> bool:
    """Whether the router's own channel refused the worker's reply as over its receive limit.
    NOTE: grpc says so only in words (RESOURCE_EXHAUSTED is also a full worker's code)."""
    return (
        error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        and "Received message larger than max" in (error.details() or "")
    )
