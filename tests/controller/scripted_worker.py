"""A scripted stand-in for a worker: a real `Inference` and `WorkerStreams` server on loopback
and a real `WorkerRegistry` client, sending capability and realized reports built from `policy`
values. The controller reaches it on `WorkerStreams.Serve` (its multiplexed call); each request
started there plays the same script as a direct `Generate`.

It streams fake tokens, or blocks until cancelled (recording that the cancel arrived), or answers
RESOURCE_EXHAUSTED as a worker whose queue is full would, or INVALID_ARGUMENT as its engine does
for a bad field, or breaks a stream with UNAVAILABLE as a worker whose engine loop closed does.
With `max_in_flight`, it admits as a worker does: a request past that many in flight (on every
call, from every router) is refused RESOURCE_EXHAUSTED, and the most it held is recorded.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from intentserve import convert
from intentserve.common.field_errors import FieldError, FieldViolation, details_of
from intentserve.common.status import rich_status
from intentserve.common.tls import (
    CONTROLLER,
    TlsIdentity,
    secure_channel,
    server_credentials,
    server_name,
)
from intentserve.policy import (
    BackendKind,
    CacheKind,
    Capability,
    ModelFacts,
    PagedAttentionConfig,
    RealizedCache,
    Reason,
    Resolution,
    SchedulerKind,
)
from intentserve.policy.examples import LLAMA, kv_bytes_per_token
from intentserve.v1 import (
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)


class Behaviour(enum.Enum):
    STREAM = "stream"  # `num_tokens` chunks, `token_delay_s` apart
    BLOCK = "block"  # one chunk, then wait until the call is cancelled
    BUSY = "busy"  # RESOURCE_EXHAUSTED: the worker's queue is full
    INVALID = "invalid"  # INVALID_ARGUMENT naming a field, as the engine's checks answer
    BREAK = "break"  # one chunk, then UNAVAILABLE; the server and its connection stay up


# What the engine's check sends: the message, and the field as a BadRequest detail.
INVALID_FIELD = FieldViolation("stop.max_tokens", "must be a positive integer, got 0")
INVALID_DETAILS = f"{INVALID_FIELD.field}: {INVALID_FIELD.description}"
TOKENIZE_REFUSAL = FieldViolation("prompt", "makes no tokens")
BREAK_DETAILS = "the engine loop is closed"
PLAY_THREAD = "scripted-play"  # a thread per request the worker plays
MAX_STREAMS = 40  # a thread per stream: 32 concurrent streams reach one worker in load tests


class _FakeInference(inference_pb2_grpc.InferenceServicer):
    def __init__(self, worker: ScriptedWorker) -> None:
        self._worker = worker

    def Generate(self, request, context):
        w = self._worker
        with w.lock:
            w.requests.append(request)
            w.deadlines_s.append(context.time_remaining())
        if w.behaviour is Behaviour.BUSY:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{w.worker_id}: queue full")
        if w.behaviour is Behaviour.INVALID:
            context.abort_with_status(
                rich_status(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    INVALID_DETAILS,
                    FieldError(INVALID_FIELD.field, INVALID_FIELD.description),
                )
            )
        if w.behaviour is Behaviour.BREAK:
            yield inference_pb2.GenerateResponse(request_id=request.request_id, token_ids=[1])
            context.abort(grpc.StatusCode.UNAVAILABLE, BREAK_DETAILS)
        if w.behaviour is Behaviour.BLOCK:
            context.add_callback(w.cancelled.set)
            yield inference_pb2.GenerateResponse(request_id=request.request_id, token_ids=[1])
            while context.is_active():
                time.sleep(0.01)
            return
        for i in range(w.num_tokens):
            if i:
                time.sleep(w.token_delay_s)
            last = i == w.num_tokens - 1
            yield inference_pb2.GenerateResponse(
                request_id=request.request_id,
                token_ids=[100 + i],
                text=f"t{i} ",
                num_output_tokens=i + 1,
                finish_reason=inference_pb2.FINISH_REASON_LENGTH if last else 0,
            )

    def Tokenize(self, request, context):
        """One token a character (its code point); INVALID: the prompt is refused by name."""
        if self._worker.behaviour is Behaviour.INVALID:
            refusal = FieldError(TOKENIZE_REFUSAL.field, TOKENIZE_REFUSAL.description)
            context.abort_with_status(
                rich_status(grpc.StatusCode.INVALID_ARGUMENT, str(refusal), refusal)
            )
        text = request.prompt or "".join(m.content for m in request.messages)
        return inference_pb2.TokenizeResponse(tokens=[ord(c) for c in text], max_model_len=64)

    def Detokenize(self, request, context):
        return inference_pb2.DetokenizeResponse(prompt="".join(chr(t) for t in request.tokens))


class _FakeStreams(worker_pb2_grpc.WorkerStreamsServicer):
    """Each started request plays the worker's script on a thread of its own; its responses
    and its end go out as events, one message each."""

    def __init__(self, worker: ScriptedWorker) -> None:
        self._worker = worker

    def Serve(self, request_iterator, context):
        with self._worker.lock:
            self._worker.num_serve_calls += 1
        events: queue.SimpleQueue = queue.SimpleQueue()
        cancels: dict[int, threading.Event] = {}
        ended = threading.Event()
        context.add_callback(ended.set)

        def read() -> None:
            with contextlib.suppress(grpc.RpcError):
                for command in request_iterator:
                    if command.WhichOneof("command") == "start":
                        with self._worker.lock:  # in the order the controller sent them
                            self._worker.arrivals.append(command.start.prompt)
                        cancels[command.stream] = threading.Event()
                        threading.Thread(
                            target=self._play,
                            args=(command, cancels[command.stream], ended, events),
                            name=f"{PLAY_THREAD}-{command.stream}",
                            daemon=True,
                        ).start()
                    elif command.stream in cancels:
                        cancels[command.stream].set()
            ended.set()
            events.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (event := events.get()) is not None:
            yield worker_pb2.StreamEvents(events=[event])

    def _play(self, command, cancelled, ended, events) -> None:
        w, key, request = self._worker, command.stream, command.start
        with w.lock:
            w.requests.append(request)
            w.deadlines_s.append(command.timeout_s)

        def output(**fields) -> None:
            response = inference_pb2.GenerateResponse(request_id=request.request_id, **fields)
            events.put(worker_pb2.StreamEvent(stream=key, output=response))

        def error(code: grpc.StatusCode, details: str, rich=()) -> None:
            failure = worker_pb2.StreamError(
                code=code.value[0], details=details, status_details=rich
            )
            events.put(worker_pb2.StreamEvent(stream=key, error=failure))

        if w.behaviour is Behaviour.BUSY:
            return error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{w.worker_id}: queue full")
        with w.lock:
            if w.max_in_flight is not None and w.num_in_flight >= w.max_in_flight:
                w.num_refused += 1
                full = f"{w.worker_id}: all {w.max_in_flight} slots are taken"
                return error(grpc.StatusCode.RESOURCE_EXHAUSTED, full)
            w.num_in_flight += 1
            w.peak_in_flight = max(w.peak_in_flight, w.num_in_flight)
        try:
            self._script(w, cancelled, ended, request, output, error)
        finally:
            with w.lock:
                w.num_in_flight -= 1

    def _script(self, w, cancelled, ended, request, output, error) -> None:
        if w.behaviour is Behaviour.INVALID:
            return error(
                grpc.StatusCode.INVALID_ARGUMENT, INVALID_DETAILS, details_of(INVALID_FIELD)
            )
        if w.behaviour is Behaviour.BREAK:
            output(token_ids=[1])
            return error(grpc.StatusCode.UNAVAILABLE, BREAK_DETAILS)
        if w.behaviour is Behaviour.BLOCK:
            output(token_ids=[1])
            while not (cancelled.wait(0.01) or ended.is_set()):
                pass
            if cancelled.is_set():  # its own cancel command, not the whole call ending
                with w.lock:
                    w.cancelled_ids.append(request.request_id)
            w.cancelled.set()
            return output(finish_reason=inference_pb2.FINISH_REASON_ABORT)
        for i in range(w.num_tokens):
            if i:
                time.sleep(w.token_delay_s)
            last = i == w.num_tokens - 1
            for index in range(request.n or 1):  # each choice's tokens, as a step gives them
                output(
                    token_ids=[100 + i],
                    text=f"t{i} ",
                    num_output_tokens=i + 1,
                    num_prompt_tokens=5 if last else 0,
                    finish_reason=inference_pb2.FINISH_REASON_LENGTH if last else 0,
                    index=index,
                )


# Float32 K and V of one token of the example model (`examples.LLAMA`), over all layers.
PER_TOKEN = kv_bytes_per_token(LLAMA)
HONEST_WEIGHT_BYTES = 92 << 20  # what an honest paged worker reports holding (SmolLM2 native)


def realized_for(
    config: PagedAttentionConfig | None, resolution: Resolution, model: ModelFacts = LLAMA
) -> RealizedCache:
    """What an honest engine builds for its resolution (geometry consistent with the model;
    no KV cache at all for a model that has none)."""
    per_token = kv_bytes_per_token(model)
    if not model.has_kv_cache:
        return RealizedCache(
            kind=CacheKind.NONE,
            max_num_seqs=4,
            scheduler=SchedulerKind.DEFAULT,
            fallback_reasons=resolution.fallback_reasons,
            weight_format=resolution.weights.format,
        )
    if resolution.paged_attention.enabled:
        return RealizedCache(
            kind=CacheKind.PAGED,
            backend=resolution.backend.kind,
            prefix_caching=resolution.prefix_caching.enabled,
            block_size=config.block_size,
            num_blocks=64,
            kv_cache_bytes=64 * config.block_size * per_token,
            max_num_seqs=8,
            kv_cache_dtype="float32",
            scheduler=SchedulerKind.PAGED,
            fallback_reasons=resolution.fallback_reasons,
            weight_format=resolution.weights.format,
            weight_bytes=HONEST_WEIGHT_BYTES,
        )
    return RealizedCache(
        kind=CacheKind.CONTIGUOUS,
        block_size=2048,
        num_blocks=4,
        max_num_seqs=4,
        kv_cache_bytes=4 * 2048 * per_token,
        kv_cache_dtype="float32",
        scheduler=SchedulerKind.DEFAULT,
        fallback_reasons=resolution.fallback_reasons,
        weight_format=resolution.weights.format,
    )


# What a worker that ignores its resolution builds (honest geometry, the wrong cache).
PAGED = RealizedCache(
    kind=CacheKind.PAGED,
    backend=BackendKind.TORCH_PAGED,
    block_size=16,
    num_blocks=64,
    kv_cache_bytes=64 * 16 * PER_TOKEN,
    max_num_seqs=8,
    kv_cache_dtype="float32",
    scheduler=SchedulerKind.PAGED,
)
CONTIGUOUS = RealizedCache(
    kind=CacheKind.CONTIGUOUS,
    block_size=2048,
    num_blocks=4,
    max_num_seqs=4,
    kv_cache_bytes=4 * 2048 * PER_TOKEN,
    kv_cache_dtype="float32",
    scheduler=SchedulerKind.DEFAULT,
)


class ScriptedWorker:
    def __init__(
        self,
        controller_address: str,
        worker_id: str,
        capability: Capability,
        *,
        behaviour: Behaviour = Behaviour.STREAM,
        num_tokens: int = 3,
        token_delay_s: float = 0.0,
        tls: TlsIdentity | None = None,
        deployment: str = "",
        max_in_flight: int | None = None,
    ) -> None:
        """With `tls` (this worker's certificate and key, of `deployment`'s CA), it registers
        on the controller's mutual-TLS port and serves the controller over TLS, as a real
        worker does."""
        self.worker_id = worker_id
        self.capability = capability
        self.behaviour = behaviour
        self.num_tokens = num_tokens
        self.token_delay_s = token_delay_s
        self.max_in_flight = max_in_flight  # None: no limit of its own
        self.num_in_flight = 0
        self.peak_in_flight = 0
        self.num_refused = 0  # requests refused as past `max_in_flight`
        self.lock = threading.Lock()
        self.requests: list[inference_pb2.GenerateRequest] = []
        self.deadlines_s: list[float] = []
        self.arrivals: list[str] = []  # prompts started on its multiplexed call, in order
        self.num_serve_calls = 0  # multiplexed calls the controller opened
        self.cancelled = threading.Event()
        self.cancelled_ids: list[str] = []  # requests whose own cancel command arrived
        self.config: PagedAttentionConfig | None = None
        self.resolution: Resolution | None = None
        self.rejection: Reason | None = None
        self.actions: list[int] = []
        self.token = b""  # its registration's, carried by its reports and heartbeats
        self._server = grpc.server(futures.ThreadPoolExecutor(MAX_STREAMS))
        inference_pb2_grpc.add_InferenceServicer_to_server(_FakeInference(self), self._server)
        worker_pb2_grpc.add_WorkerStreamsServicer_to_server(_FakeStreams(self), self._server)
        # As a worker's server does: the controller watches its connection through health.
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), self._server)
        if tls is None:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
            self._channel = grpc.insecure_channel(controller_address)
        else:
            credentials = server_credentials(tls, require_client_auth=True)
            self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
            name = server_name(deployment, CONTROLLER)
            self._channel = secure_channel(controller_address, tls, name)
        self._server.start()
        self._registry = worker_pb2_grpc.WorkerRegistryStub(self._channel)
        self._beating = threading.Event()
        self._beat_thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def num_requests(self) -> int:
        with self.lock:
            return len(self.requests)

    def register(self) -> worker_pb2.RegisterResponse:
        """Register; a refusal is kept in `rejection` (the structured reason)."""
        response = self._registry.Register(
            worker_pb2.RegisterRequest(
                worker_id=self.worker_id,
                address=self.address,
                capability=convert.capability_to_pb(self.capability),
            ),
            timeout=5,
        )
        self.token = response.registration_token
        if response.WhichOneof("outcome") == "rejection":
            self.rejection = convert.reason_from_pb(response.rejection)
        else:
            self.config, self.resolution, _ = convert.resolution_from_pb(response.config)
        return response

    def matching_realized(self) -> RealizedCache:
        return realized_for(self.config, self.resolution, self.capability.model)

    def report(
        self, realized: RealizedCache | None = None, load_error: Reason | None = None
    ) -> worker_pb2.Verification:
        """Report `realized` (default: what matches the resolution), or a load error."""
        request = worker_pb2.RealizedReport(worker_id=self.worker_id, registration_token=self.token)
        if load_error is not None:
            request.load_error.CopyFrom(convert.reason_to_pb(load_error))
        else:
            state = realized if realized is not None else self.matching_realized()
            request.realized.CopyFrom(convert.realized_to_pb(state))
        return self._registry.ReportRealized(request, timeout=5)

    def heartbeat(self, num_kv_used: int = 3, num_kv_total: int = 64) -> int:
        response = self._registry.Heartbeat(
            worker_pb2.HeartbeatRequest(
                worker_id=self.worker_id,
                num_kv_used=num_kv_used,
                num_kv_total=num_kv_total,
                registration_token=self.token,
                num_steps=10,
                total_step_s=0.25,
                num_step_seqs=30,
            ),
            timeout=5,
        )
        self.actions.append(response.action)
        return response.action

    def start_heartbeats(self, interval_s: float = 0.1) -> None:
        self._beating.set()

        def beat() -> None:
            while self._beating.is_set():
                # The controller may be stopping; the next beat tries again.
                with contextlib.suppress(grpc.RpcError):
                    self.heartbeat()
                time.sleep(interval_s)

        self._beat_thread = threading.Thread(target=beat, daemon=True)
        self._beat_thread.start()

    def stop_heartbeats(self) -> None:
        self._beating.clear()
        if self._beat_thread is not None:
            self._beat_thread.join()
            self._beat_thread = None

    def up(self, realized: RealizedCache | None = None) -> worker_pb2.Verification:
        """Register, heartbeat and report: the whole start-up of a worker."""
        self.register()
        self.start_heartbeats()
        return self.report(realized)

    def kill_server(self) -> None:
        """The worker process dies: its Inference server goes away mid-stream."""
        self._server.stop(0).wait()

    def stop(self) -> None:
        self.stop_heartbeats()
        self._server.stop(0).wait()
        self._channel.close()
