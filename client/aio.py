"""The asyncio client of a controller or a router."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client.calls import ClientError, SharedCall, Streams, bearer, chunk_of
from intentserve.client.credentials import Credentials
from intentserve.client.credentials import load as load_credentials
from intentserve.client.data import to_data
from intentserve.client.requests import check_timeout, generate_request
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2

DEFAULT_CONTROLLER = "127.0.0.1:50051"


class AsyncControllerClient:
    """A controller's (or a router's) Inference, Admin and health calls for asyncio
    applications: one grpc.aio channel, made on the event loop of the first call (use the client
    on that loop only). Every `generate` of the client shares one `Inference.GenerateMany` call:
    the tokens the server has for many streams at once come in one message, not one per stream.
    Every failure is a `ClientError` (a `grpc.RpcError`) with the status the server gave."""

    def __init__(
        self,
        address: str = DEFAULT_CONTROLLER,
        timeout_s: float = 10.0,
        credentials: Credentials | None = None,
    ) -> None:
        """`credentials` default to what `up` wrote for `address` (and the environment)."""
        self.address = address
        self.timeout_s = timeout_s
        self._credentials = credentials if credentials is not None else load_credentials(address)
        self._admin_auth = bearer(self._credentials.admin_token)
        self._client_auth = bearer(self._credentials.api_key or self._credentials.admin_token)
        self._streams = Streams(address, self._credentials, self._client_auth)

    def _open(self) -> grpc.aio.Channel:
        return self._streams.channel()

    async def generate(
        self,
        prompt: str,
        *,
        chat: bool = False,
        max_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        n: int = 1,
        timeout_s: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the chunks of one generation, as `ControllerClient.generate` does. Leaving the
        loop early (or the task being cancelled) cancels the request on its worker; the
        controller holds the request to `timeout_s`."""
        check_timeout(timeout_s)
        request = generate_request(
            prompt,
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop,
            ignore_eos=ignore_eos,
            n=n,
        )
        events: asyncio.Queue = asyncio.Queue()
        shared, key = self.start(request, timeout_s, events)
        num_running, ended = request.n or 1, False  # 0 on the wire is 1
        try:
            while not ended:
                event = await events.get()
                ended = True  # unless it reads as a chunk that does not finish the request
                chunk, finished = chunk_of(event)
                num_running -= finished
                ended = not num_running
                yield chunk
        finally:
            if not ended:
                shared.cancel(key)

    def start(
        self, request: inference_pb2.GenerateRequest, timeout_s: float | None, events
    ) -> tuple[SharedCall, int]:
        """Start `request` on the shared call, its events into `events` (an asyncio.Queue, or a
        queue.SimpleQueue read by another thread); the call and the request's key. On the
        client's loop only."""
        return self._streams.start(request, timeout_s, events)

    async def status(self) -> dict[str, Any]:
        return to_data(await self._admin("Status", admin_pb2.StatusRequest()))

    async def explain(self, worker_id: str) -> dict[str, Any]:
        return to_data(await self._admin("Explain", admin_pb2.ExplainRequest(worker_id=worker_id)))

    async def drain(self, worker_id: str, *, force: bool = False) -> dict[str, Any]:
        request = admin_pb2.DrainRequest(worker_id=worker_id, force=force)
        return to_data(await self._admin("Drain", request))

    async def resume(self, worker_id: str) -> dict[str, Any]:
        return to_data(await self._admin("Resume", admin_pb2.ResumeRequest(worker_id=worker_id)))

    async def shutdown(self) -> None:
        await self._admin("Shutdown", admin_pb2.ShutdownRequest())

    async def health(self, service: str = "") -> str:
        """ "serving", "not_serving", ... as `grpc.health.v1` reports it."""
        stub = health_pb2_grpc.HealthStub(self._open())
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            response = await stub.Check(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            raise ClientError(error.code(), error.details() or "") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status).lower()

    async def _admin(self, method: str, request):
        stub = admin_pb2_grpc.AdminStub(self._open())
        try:
            return await getattr(stub, method)(
                request, timeout=self.timeout_s, metadata=self._admin_auth
            )
        except grpc.RpcError as error:
            raise ClientError(error.code(), error.details() or "") from None

    async def close(self) -> None:
        await self._streams.aclose()

    async def __aenter__(self) -> AsyncControllerClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
