"""The worker's gRPC server: Inference, WorkerStreams (the controller's multiplexed stream),
WorkerInfoService, `grpc.health.v1` and reflection, over one engine driven by an `EngineLoop`.

    server = WorkerServer(engine, "worker-0", "smollm2-135m").start()
    ...  # register server.address with the controller; heartbeat with server.loop.load()
    server.stop()

Health says SERVING from `start()` until `stop()` or a drain, except while the engine's steps
fail: three failed steps in a row (the model forward, not one request's own error) make it
NOT_SERVING, and the next step that succeeds makes it SERVING again (`step_health`).
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from intentserve.common.status import ErrorInterceptor
from intentserve.common.streaming import MAX_COMMAND_BYTES
from intentserve.common.tls import CONTROLLER, ROUTER, PeerGate, TlsIdentity, server_credentials
from intentserve.policy import Capability
from intentserve.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from intentserve.worker.engine.encoder_engine import EncoderEngine
from intentserve.worker.engine.engine import Engine
from intentserve.worker.service.encoder_servicer import EncoderCalls, EncoderInferenceServicer
from intentserve.worker.service.engine_loop import EngineLoop
from intentserve.worker.service.interceptor import STATUS_CODES
from intentserve.worker.service.mux import StreamsServicer
from intentserve.worker.service.servicer import (
    InferenceServicer,
    StreamSlots,
    WorkerInfoServicer,
)
from intentserve.worker.service.step_health import StepHealth

log = logging.getLogger(__name__)
# Who may call the worker's own services under TLS: its controller and the routers.
PEERS = frozenset({CONTROLLER, ROUTER})

# Threads beyond the streams, so Info, health and reflection never queue behind inference.
CONTROL_THREADS = 4
# Streams admitted per sequence slot of the scheduler; the excess waits in the engine's queue.
STREAMS_PER_SEQ = 4
SERVED_NAMES = (
    inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerStreams"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerInfoService"].full_name,
)
HEALTH_NAMES = ("", *SERVED_NAMES)  # "" is the whole server, as grpc_health_probe asks
REFLECTION_NAMES = (
    *SERVED_NAMES,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


class WorkerServer:
    """`start()`, then `stop()`; or use it as a context. The port is bound at construction."""

    def __init__(
        self,
        engine: Engine | EncoderEngine,
        worker_id: str,
        model_ref: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        capability: Capability | None = None,
        max_streams: int | None = None,
        tls: TlsIdentity | None = None,
        deployment: str = "",
        stream_interval: int = 1,
    ) -> None:
        """With `tls`, the server speaks TLS and serves only its controller and the routers
        (mutual TLS: the peer must present `deployment`'s `controller` or `router`
        certificate); without it, plaintext.
        `stream_interval`: tokens per message of each stream after its first (EngineLoop)."""
        self.worker_id = worker_id
        self.host = host
        encoder = isinstance(engine, EncoderEngine)
        max_streams = max_streams or (
            engine.realized.cache.max_num_seqs
            if encoder
            else STREAMS_PER_SEQ * engine.scheduler.max_num_seqs
        )
        # NOTE: public so the host can publish NOT_SERVING while it drains.
        self.health = health.HealthServicer()
        self._draining = False
        for name in HEALTH_NAMES:
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        slots = StreamSlots(worker_id, max_streams)
        # An encoder has no engine loop: its Embed calls run on the server's threads.
        self.loop: EngineLoop | EncoderCalls = (
            EncoderCalls(slots)
            if encoder
            else EngineLoop(
                engine,
                name=f"engine-loop-{worker_id}",
                health=StepHealth(self.health, HEALTH_NAMES, may_serve=lambda: not self._draining),
                stream_interval=stream_interval,
            )
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_streams + CONTROL_THREADS, thread_name_prefix=f"{worker_id}-rpc"
            ),
            interceptors=[
                *([PeerGate(PEERS, deployment)] if tls is not None else []),
                ErrorInterceptor(STATUS_CODES),
            ],
            # NOTE: a start command carries a request the controller checked against
            # MAX_REQUEST_BYTES; one over this limit would end the whole multiplexed call.
            options=[("grpc.max_receive_message_length", MAX_COMMAND_BYTES)],
        )
        if encoder:
            inference_pb2_grpc.add_InferenceServicer_to_server(
                EncoderInferenceServicer(engine, worker_id, self.loop), self._server
            )
            self._streams = None  # nothing streams: WorkerStreams is not served (UNIMPLEMENTED)
        else:
            inference_pb2_grpc.add_InferenceServicer_to_server(
                InferenceServicer(self.loop, worker_id, slots), self._server
            )
            self._streams = StreamsServicer(self.loop, worker_id, slots)
            worker_pb2_grpc.add_WorkerStreamsServicer_to_server(self._streams, self._server)
        worker_pb2_grpc.add_WorkerInfoServiceServicer_to_server(
            WorkerInfoServicer(worker_id, model_ref, engine.realized, capability), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(REFLECTION_NAMES, self._server)
        try:
            bind = f"{host}:{port}"
            self.bound_port = (
                self._server.add_insecure_port(bind)
                if tls is None
                else self._server.add_secure_port(
                    bind, server_credentials(tls, require_client_auth=True)
                )
            )
        except RuntimeError:
            self.bound_port = 0
        if not self.bound_port:
            self._close_streams()
            self.loop.close()
            raise OSError(f"worker {worker_id}: cannot listen on {host}:{port}")

    @property
    def address(self) -> str:
        """Where the controller and clients reach it (loopback when bound to every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "[::]", "::") else self.host
        return f"{host}:{self.bound_port}"

    def start(self) -> WorkerServer:
        self._server.start()
        for name in HEALTH_NAMES:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        interval = self.loop.stream_interval
        log.info(
            "worker %s serving on %s, streaming %s",
            self.worker_id,
            self.address,
            "every token" if interval == 1 else f"{interval} tokens a message after the first",
        )
        return self

    def set_draining(self, draining: bool) -> None:
        """Health NOT_SERVING while the controller drains this worker (its streams finish);
        SERVING again when it resumes it."""
        if draining == self._draining:
            return
        self._draining = draining
        status = health_pb2.HealthCheckResponse
        for name in HEALTH_NAMES:
            self.health.set(name, status.NOT_SERVING if draining else status.SERVING)

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Health goes NOT_SERVING, running streams get `grace_s` to finish, then the server
        and the engine loop stop (streams still running are cancelled, their KV freed)."""
        self.health.enter_graceful_shutdown()
        self._server.stop(grace_s).wait()
        self._close_streams()
        self.loop.close()

    def _close_streams(self) -> None:
        if self._streams is not None:
            self._streams.close()

    def __enter__(self) -> WorkerServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop(grace_s=0)
