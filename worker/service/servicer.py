"""Thin servicers: decode the request, call the engine loop, encode the answer.

Errors propagate as exceptions; `interceptor.ErrorInterceptor` turns them into status codes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import grpc
from intentserve.policy import Capability
from intentserve.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from intentserve.worker.engine.encoder_engine import WrongTaskError
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoop

EMBED_REFUSED = (
    "this worker's model generates (task generate): Embed needs an encoder model's deployment "
    "(deploy/embeddings.yaml)"
)


class WorkerOverloadedError(RuntimeError):
    """Every stream slot of the worker is taken (RESOURCE_EXHAUSTED, never a silent queue)."""


class StreamSlots:
    """The worker's limit on requests in flight, shared by `Generate` calls and the requests of
    the multiplexed stream (`mux`); a request of n choices takes n slots."""

    def __init__(self, worker_id: str, max_streams: int) -> None:
        self.worker_id = worker_id
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._num_taken = 0

    def acquire(self, num: int = 1) -> None:
        """Take `num` slots, or none and raise WorkerOverloadedError at once (never wait)."""
        with self._lock:
            if self._num_taken + num > self.max_streams:
                raise WorkerOverloadedError(
                    f"worker {self.worker_id} is serving its maximum of {self.max_streams} "
                    f"streams ({self._num_taken} taken, {num} asked)"
                )
            self._num_taken += num

    def release(self, num: int = 1) -> None:
        with self._lock:
            if num > self._num_taken:
                raise RuntimeError(f"releasing {num} stream slots; {self._num_taken} are taken")
            self._num_taken -= num

    @contextlib.contextmanager
    def held(self, num: int = 1) -> Iterator[None]:
        self.acquire(num)
        try:
            yield
        finally:
            self.release(num)


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, loop: EngineLoop, worker_id: str, slots: StreamSlots) -> None:
        self._loop = loop
        self._worker_id = worker_id
        self._slots = slots

    def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[inference_pb2.GenerateResponse]:
        call = convert.generate_request_from_pb(request)
        self._loop.engine.check_num_choices(call.n)  # before its slots: past them it never fits
        # NOTE: each stream holds a server thread; past max_streams a call would queue unseen.
        with self._slots.held(call.n):
            with convert.proto_field_names():
                stream = self._loop.submit(
                    call.prompt, call.params, call.request_id, chat=call.chat, n=call.n
                )
            # Client cancel or deadline: abort at once, even while the request is still queued.
            if not context.add_callback(stream.cancel):
                stream.cancel()
            try:
                for output in stream:
                    if not context.is_active():
                        break
                    yield convert.generate_response_to_pb(output, self._worker_id)
            finally:
                stream.cancel()  # a no-op once the stream finished

    def Tokenize(
        self, request: inference_pb2.TokenizeRequest, context: grpc.ServicerContext
    ) -> inference_pb2.TokenizeResponse:
        # NOTE: on this server thread, never on the engine loop (the tokenizer is read only).
        call = convert.tokenize_request_from_pb(request)
        engine = self._loop.engine
        with convert.proto_field_names():
            token_ids = engine.tokenize(call.prompt, call.add_bos)
        strs = [engine.tokenizer.token_text(t) or "" for t in token_ids]
        return convert.tokenize_response_to_pb(
            token_ids, strs if call.return_token_strs else [], engine.max_model_len
        )

    def Detokenize(
        self, request: inference_pb2.DetokenizeRequest, context: grpc.ServicerContext
    ) -> inference_pb2.DetokenizeResponse:
        text = self._loop.engine.detokenize(convert.detokenize_request_from_pb(request))
        return inference_pb2.DetokenizeResponse(prompt=text)

    def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        raise WrongTaskError(EMBED_REFUSED)


class WorkerInfoServicer(worker_pb2_grpc.WorkerInfoServiceServicer):
    def __init__(
        self,
        worker_id: str,
        model_ref: str,
        realized: RealizedReport,
        capability: Capability | None = None,
    ) -> None:
        self._worker_id = worker_id
        self._model_ref = model_ref
        self._realized = realized
        self._capability = capability

    def Info(
        self, request: worker_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> worker_pb2.WorkerInfo:
        return convert.worker_info_to_pb(
            self._worker_id, self._model_ref, self._realized, self._capability
        )
