"""The Inference service of an encoder worker: Embed, Tokenize and Detokenize; Generate and
GenerateMany refused naming the task (FAILED_PRECONDITION), never answered with nothing.

Embed runs on the calling server thread (the encoder holds one batch at a time); calls past
the worker's bound are refused RESOURCE_EXHAUSTED at once, as a full decoder worker's are.
"""

from __future__ import annotations

import threading
import time

import grpc
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.engine.encoder_engine import EncoderEngine, WrongTaskError
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.service.engine_loop import EngineLoad
from intentserve.worker.service.servicer import StreamSlots

GENERATE_REFUSED = (
    "this worker's model is an encoder (task embed): it serves Embed (POST /v1/embeddings), "
    "not generation; deploy a decoder model for completions"
)


class EncoderCalls:
    """The Embed calls in flight, as the heartbeat's load (the engine loop's part on a decoder
    worker): running calls count as running sequences, out of the worker's slots."""

    stream_interval = 1  # nothing streams; said in the start-up line as a decoder's is

    def __init__(self, slots: StreamSlots) -> None:
        self.slots = slots
        self._lock = threading.Lock()
        self._running = 0
        self._calls = 0
        self._seconds = 0.0

    def load(self) -> EngineLoad:
        with self._lock:
            return EngineLoad(
                self._running,
                0,
                0,
                0,
                num_steps=self._calls,
                total_step_s=self._seconds,
                num_step_seqs=self._calls,
            )

    def started(self) -> None:
        with self._lock:
            self._running += 1

    def ended(self, seconds: float) -> None:
        with self._lock:
            self._running -= 1
            self._calls += 1
            self._seconds += seconds

    def close(self) -> None:
        """Nothing to stop: calls run on the server's threads."""


class EncoderInferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(self, engine: EncoderEngine, worker_id: str, calls: EncoderCalls) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._calls = calls

    def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        with self._calls.slots.held():
            self._calls.started()
            began = time.monotonic()
            try:
                done = self._engine.embed(
                    texts=list(request.texts) or None,
                    token_inputs=[list(t.ids) for t in request.token_inputs] or None,
                    dimensions=request.dimensions if request.HasField("dimensions") else None,
                )
            finally:
                self._calls.ended(time.monotonic() - began)
        return inference_pb2.EmbedResponse(
            request_id=request.request_id,
            embeddings=[
                inference_pb2.Embedding(values=row, num_tokens=n)
                for row, n in zip(done.vectors.tolist(), done.num_tokens, strict=True)
            ],
            num_prompt_tokens=sum(done.num_tokens),
            worker_id=self._worker_id,
        )

    def Tokenize(
        self, request: inference_pb2.TokenizeRequest, context: grpc.ServicerContext
    ) -> inference_pb2.TokenizeResponse:
        if request.messages:
            raise InvalidRequestError(
                "messages", "an encoder has no chat template; allowed: prompt (a text)"
            )
        ids = self._engine.tokenize(request.prompt)
        return inference_pb2.TokenizeResponse(tokens=ids, max_model_len=self._engine.max_model_len)

    def Detokenize(
        self, request: inference_pb2.DetokenizeRequest, context: grpc.ServicerContext
    ) -> inference_pb2.DetokenizeResponse:
        return inference_pb2.DetokenizeResponse(
            prompt=self._engine.detokenize(list(request.tokens))
        )

    def Generate(self, request, context):
        raise WrongTaskError(GENERATE_REFUSED)

    def GenerateMany(self, request_iterator, context):
        raise WrongTaskError(GENERATE_REFUSED)
