"""Simulated workers: the worker protocol with no model, for measuring what carries tokens.

A `SimWorker` does what a real worker does on the wire: it registers with the controller's
registry on mutual TLS with a certificate of the deployment's CA, reports a realized cache the
controller verifies (consistent with its resolution and capability), heartbeats, and serves
`WorkerStreams.Serve` (the controller's multiplexed call), `Inference.Generate` (one request a
call) and `grpc.health.v1`. In place of an engine a clock ticks every `step_s`: at each tick
every running request gets `tokens_per_step` tokens, and each `Serve` call sends its requests'
news: a message a step while the controller keeps up, every step's since the last message when it
does not (the steps do not wait for the sends), as the worker's outbox does.

    python bench/simworker.py --registry 127.0.0.1:50052 --deployment d --identities DIR \
        --ids d-0,d-1 --step-ms 20 --slots 512

hosts the listed workers on one event loop (each identity is `DIR/<id>.json`, the shape of
`TlsIdentity.to_dict`), prints `ready <id> <address>` for each once verified, and serves until
killed. NOTE: its server takes any peer with a certificate of the CA (the real worker lets only
the controller call it), so a benchmark's client can call a worker straight, with no relay.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import _async as async_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve import convert
from intentserve.common.tls import (
    CONTROLLER,
    TlsIdentity,
    secure_aio_channel,
    server_credentials,
    server_name,
)
from intentserve.controller.pending_calls import PENDING_CALL_LIMITS
from intentserve.policy import (
    CacheKind,
    Capability,
    PagedAttentionConfig,
    RealizedCache,
    Resolution,
    SchedulerKind,
    examples,
)
from intentserve.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc

ABORT = inference_pb2.FINISH_REASON_ABORT
LENGTH = inference_pb2.FINISH_REASON_LENGTH
RPC_TIMEOUT_S = 10.0
# What worker/service/mux.py sends in one message at most.
MAX_EVENTS_PER_MESSAGE = 1024


def realized_for(
    config: PagedAttentionConfig | None,
    resolution: Resolution,
    capability: Capability,
    max_num_seqs: int,
) -> RealizedCache:
    """What an honest engine of `capability` builds for `resolution`: a paged pool (one block a
    sequence) when paged attention is enabled, else a contiguous cache; float32 K and V."""
    per_token = examples.kv_bytes_per_token(capability.model)
    paged = resolution.paged_attention.enabled
    block_size = config.block_size if paged else 256
    return RealizedCache(
        kind=CacheKind.PAGED if paged else CacheKind.CONTIGUOUS,
        backend=resolution.backend.kind,
        prefix_caching=resolution.prefix_caching.enabled,
        block_size=block_size,
        num_blocks=max_num_seqs,
        kv_cache_bytes=max_num_seqs * block_size * per_token,
        max_num_seqs=max_num_seqs,
        kv_cache_dtype="float32",
        scheduler=SchedulerKind.PAGED if paged else SchedulerKind.DEFAULT,
        fallback_reasons=resolution.fallback_reasons,
        weight_format=resolution.weights.format,
    )


@dataclass
class _Request:
    request_id: str
    num_tokens: int  # what the request asks for (stop.max_tokens)
    deadline_s: float  # monotonic; inf: none
    num_sent: int = 0
    cancelled: bool = False

    def advance(self, message: inference_pb2.GenerateResponse, worker_id: str, k: int) -> bool:
        """Fill `message` with this step's tokens (up to `k`); True when it is the last."""
        message.request_id = self.request_id
        message.worker_id = worker_id
        if self.cancelled or time.monotonic() > self.deadline_s:
            message.finish_reason = ABORT
            return True
        n = min(k, self.num_tokens - self.num_sent)
        message.token_ids.extend(range(100 + self.num_sent, 100 + self.num_sent + n))
        message.text = "tok " * n
        self.num_sent += n
        message.num_output_tokens = self.num_sent
        if self.num_sent == self.num_tokens:
            message.finish_reason = LENGTH
            return True
        return False


def _request(start: inference_pb2.GenerateRequest, timeout_s: float) -> _Request | str:
    """The request to play, or the INVALID_ARGUMENT details a worker answers for it."""
    if start.stop.max_tokens < 1:
        return f"stop.max_tokens: must be a positive integer, got {start.stop.max_tokens}"
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else float("inf")
    return _Request(start.request_id, start.stop.max_tokens, deadline)


@dataclass
class _Clock:
    """The engine's steps: every waiter wakes at the same tick (`await clock.next()`)."""

    step_s: float
    tick: asyncio.Future = field(init=False)
    num_steps: int = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.tick = loop.create_future()
        due = time.monotonic()
        while True:
            due = max(due + self.step_s, time.monotonic())  # a late step is late, not doubled
            await asyncio.sleep(due - time.monotonic())
            self.tick, done = loop.create_future(), self.tick
            self.num_steps += 1
            done.set_result(None)

    async def next(self) -> None:
        # NOTE: shielded: a waiter that is cancelled (its call ended) would cancel the future
        # every other request waits on.
        await asyncio.shield(self.tick)


class SimWorker(worker_pb2_grpc.WorkerStreamsServicer, inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        worker_id: str,
        registry: str,
        deployment: str,
        tls: TlsIdentity,
        *,
        step_s: float = 0.02,
        tokens_per_step: int = 1,
        max_num_seqs: int = 256,
        capability: Capability | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.capability = capability or examples.cpu()
        self._registry_address, self._deployment, self._tls = registry, deployment, tls
        self._tokens_per_step = tokens_per_step
        self._max_num_seqs = max_num_seqs
        self._clock = _Clock(step_s)
        self.num_running = 0
        self.address = ""
        self._tasks: list[asyncio.Task] = []

    # -- start-up, as the worker runtime does it -----------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> str:
        """Serve, register, report what was realized and keep heartbeating; the address, once
        the controller verified the report (RuntimeError with its reason when it did not)."""
        self._server = grpc.aio.server(options=PENDING_CALL_LIMITS)  # takes every stream sent
        worker_pb2_grpc.add_WorkerStreamsServicer_to_server(self, self._server)
        inference_pb2_grpc.add_InferenceServicer_to_server(self, self._server)
        health = async_health.HealthServicer()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)
        credentials = server_credentials(self._tls, require_client_auth=True)
        port = self._server.add_secure_port(f"{host}:0", credentials)
        await self._server.start()
        self.address = f"{host}:{port}"
        self._tasks.append(asyncio.create_task(self._clock.run()))
        name = server_name(self._deployment, CONTROLLER)
        self._channel = secure_aio_channel(self._registry_address, self._tls, name)
        self._registry = worker_pb2_grpc.WorkerRegistryStub(self._channel)
        interval_s = await self._register()
        self._tasks.append(asyncio.create_task(self._heartbeats(interval_s)))
        return self.address

    async def _register(self) -> float:
        request = worker_pb2.RegisterRequest(
            worker_id=self.worker_id,
            address=self.address,
            capability=convert.capability_to_pb(self.capability),
        )
        response = await self._registry.Register(request, timeout=RPC_TIMEOUT_S)
        if response.WhichOneof("outcome") == "rejection":
            raise RuntimeError(f"{self.worker_id} rejected: {response.rejection.message}")
        self._token = response.registration_token
        config, resolution, _ = convert.resolution_from_pb(response.config)
        realized = realized_for(config, resolution, self.capability, self._max_num_seqs)
        verification = await self._registry.ReportRealized(
            worker_pb2.RealizedReport(
                worker_id=self.worker_id,
                realized=convert.realized_to_pb(realized),
                registration_token=self._token,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        if not verification.verified:
            raise RuntimeError(f"{self.worker_id} not verified: {verification.reason.message}")
        return response.heartbeat_interval_s

    async def _heartbeats(self, interval_s: float) -> None:
        """Every interval; a controller that forgot this worker (it restarted) gets it again.
        A beat that fails says how late this process's loop sent it, so that a worker declared
        lost can be told from a controller that did not answer in time."""
        while True:
            due = time.monotonic() + interval_s
            await asyncio.sleep(interval_s)
            request = worker_pb2.HeartbeatRequest(
                worker_id=self.worker_id,
                num_running=self.num_running,
                num_kv_total=self._max_num_seqs,
                num_kv_used=self.num_running,
                num_steps=self._clock.num_steps,
                registration_token=self._token,
            )
            late_s = time.monotonic() - due
            try:
                reply = await self._registry.Heartbeat(request, timeout=2 * interval_s)
                if reply.action == worker_pb2.HEARTBEAT_ACTION_REGISTER:
                    await self._register()
            except grpc.RpcError as error:  # NOTE: the next beat tries again
                print(
                    f"{self.worker_id}: heartbeat sent {late_s:.2f} s late failed: "
                    f"{error.code().name}",
                    file=sys.stderr,
                    flush=True,
                )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self._server.stop(0)
        await self._channel.close()

    # -- the controller's multiplexed call -------------------------------------------------------

    async def Serve(self, request_iterator, context):
        """As the worker's `Serve`: the steps run on the clock whether or not the last message
        has gone out; each message carries every step's news since the one before (a controller
        that reads slowly gets its backlog in fewer, larger messages, as from worker/service's
        Outbox), up to MAX_EVENTS_PER_MESSAGE events."""
        running: dict[int, _Request] = {}
        refused: list[worker_pb2.StreamEvent] = []
        outbox = _Outbox()
        reader = asyncio.create_task(self._read(request_iterator, running, refused))
        steps = asyncio.create_task(self._steps(reader, running, refused, outbox))
        try:
            while (message := await outbox.take()) is not None:
                yield message
        finally:
            reader.cancel()
            steps.cancel()
            self.num_running -= len(running)

    async def _steps(self, reader, running: dict, refused: list, outbox: _Outbox) -> None:
        try:
            while not reader.done() or running:
                await self._clock.next()
                events = outbox.events
                events.extend(refused)
                refused.clear()
                for key, request in list(running.items()):
                    if request.advance(
                        events.add(stream=key).output, self.worker_id, self._tokens_per_step
                    ):
                        del running[key]
                        self.num_running -= 1
                outbox.wake()
        finally:
            outbox.close()

    async def _read(self, commands, running: dict, refused: list) -> None:
        with contextlib.suppress(grpc.RpcError):  # the call ended: Serve ends with it
            async for command in commands:
                self._command(command, running, refused)

    def _command(self, command, running: dict, refused: list) -> None:
        key = command.stream
        if command.WhichOneof("command") == "cancel":
            if key in running:
                running[key].cancelled = True  # its ABORT goes out at the next step
            return
        request = _request(command.start, command.timeout_s)
        code = grpc.StatusCode.INVALID_ARGUMENT
        if isinstance(request, _Request) and self.num_running >= self._max_num_seqs:
            request = f"{self.worker_id}: all {self._max_num_seqs} sequence slots are taken"
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
        if isinstance(request, str):
            error = worker_pb2.StreamError(code=code.value[0], details=request)
            refused.append(worker_pb2.StreamEvent(stream=key, error=error))
            return
        running[key] = request
        self.num_running += 1

    # -- one request a call (what a client straight to a worker uses) ----------------------------

    async def Generate(self, request, context):
        playing = _request(request, context.time_remaining() or 0.0)
        if isinstance(playing, str):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, playing)
        self.num_running += 1
        try:
            last = False
            while not last:
                await self._clock.next()
                message = inference_pb2.GenerateResponse()
                last = playing.advance(message, self.worker_id, self._tokens_per_step)
                yield message
        finally:
            self.num_running -= 1


class _Outbox:
    """A `Serve` call's news not yet sent: the steps fill `events`, the sender takes them all."""

    def __init__(self) -> None:
        self._message = worker_pb2.StreamEvents()
        self._ready = asyncio.Event()
        self._closed = False

    @property
    def events(self):
        return self._message.events

    def wake(self) -> None:
        if self._message.events:
            self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def take(self) -> worker_pb2.StreamEvents | None:
        """Every event since the last take, MAX_EVENTS_PER_MESSAGE at most; None once closed and
        empty."""
        await self._ready.wait()
        message = self._message
        if not message.events:
            return None
        if len(message.events) <= MAX_EVENTS_PER_MESSAGE:
            self._message = worker_pb2.StreamEvents()
            if not self._closed:
                self._ready.clear()
            return message
        taken = worker_pb2.StreamEvents(events=message.events[:MAX_EVENTS_PER_MESSAGE])
        del message.events[:MAX_EVENTS_PER_MESSAGE]
        return taken


def load_identity(folder: Path, worker_id: str) -> TlsIdentity:
    return TlsIdentity.from_dict(json.loads((folder / f"{worker_id}.json").read_text()))


async def serve(args: argparse.Namespace) -> None:
    workers = [
        SimWorker(
            worker_id,
            args.registry,
            args.deployment,
            load_identity(Path(args.identities), worker_id),
            step_s=args.step_ms / 1000,
            tokens_per_step=args.tokens_per_step,
            max_num_seqs=args.slots,
        )
        for worker_id in args.ids.split(",")
    ]
    for worker in workers:
        print(f"ready {worker.worker_id} {await worker.start()}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True, help="the controller's registry host:port")
    parser.add_argument("--deployment", required=True, help="names the controller's certificate")
    parser.add_argument("--identities", required=True, help="folder of <worker id>.json")
    parser.add_argument("--ids", required=True, help="worker ids, comma-separated")
    parser.add_argument("--step-ms", type=float, default=20.0, help="one engine step")
    parser.add_argument("--tokens-per-step", type=int, default=1)
    parser.add_argument("--slots", type=int, default=256, help="max_num_seqs it reports")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
