"""The worker's one place where protobuf messages meet engine values (both directions).

Request errors are InvalidRequestError naming the proto field path (`stop.max_tokens`), so the
client reads the name of the field it set, not the engine's parameter name.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence

from intentserve.convert import capability_to_pb, realized_to_pb
from intentserve.policy import Capability
from intentserve.v1 import inference_pb2, worker_pb2
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.request import RequestOutput
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.model.tokenizer import Tokenizer
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service.engine_loop import EngineLoad

# Engine parameter name -> the GenerateRequest field a client sets for it.
PROTO_FIELDS = {
    "prompt": "prompt",
    "max_tokens": "stop.max_tokens",
    "stop": "stop.stop",
    "temperature": "sampling.temperature",
    "top_k": "sampling.top_k",
    "top_p": "sampling.top_p",
}

FINISH_REASONS = {
    None: inference_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: inference_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: inference_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: inference_pb2.FINISH_REASON_ABORT,
}


@contextlib.contextmanager
def proto_field_names() -> Iterator[None]:
    """Re-raise the engine's InvalidRequestError with the field named as in GenerateRequest."""
    try:
        yield
    except InvalidRequestError as error:
        path = PROTO_FIELDS.get(error.field, error.field)
        if path == error.field:
            raise
        message = str(error).removeprefix(f"{error.field}: ")
        raise InvalidRequestError(path, message) from None


def generate_request_from_pb(
    msg: inference_pb2.GenerateRequest, tokenizer: Tokenizer
) -> tuple[str | list[int], SamplingParams, str]:
    """(prompt text or token ids, sampling params, request id); a generated id when unset."""
    with proto_field_names():
        params = SamplingParams(
            max_tokens=msg.stop.max_tokens,
            temperature=msg.sampling.temperature,
            top_k=msg.sampling.top_k,
            top_p=msg.sampling.top_p or 1.0,  # 0 means "not set"
            seed=msg.sampling.seed if msg.sampling.HasField("seed") else None,
            stop_token_ids=tuple(msg.stop.stop_token_ids),
            stop=tuple(msg.stop.stop),
            ignore_eos=msg.stop.ignore_eos,
        )
    return _prompt(msg, tokenizer), params, msg.request_id or f"gen-{uuid.uuid4().hex}"


def _prompt(msg: inference_pb2.GenerateRequest, tokenizer: Tokenizer) -> str | list[int]:
    if msg.prompt_token_ids:
        if msg.chat:
            raise InvalidRequestError("chat", "applies to a text prompt, not to prompt_token_ids")
        _check_token_ids(msg.prompt_token_ids, tokenizer.vocab_size)
        return list(msg.prompt_token_ids)
    if not msg.prompt:
        raise InvalidRequestError("prompt", "must not be empty (or set prompt_token_ids)")
    if not msg.chat:
        return msg.prompt
    try:
        return tokenizer.apply_chat_template([{"role": "user", "content": msg.prompt}])
    except ValueError as error:
        raise InvalidRequestError("chat", str(error)) from None


def _check_token_ids(token_ids: Sequence[int], vocab_size: int) -> None:
    # NOTE: the engine does not range-check ids; one out of range would fail the whole step.
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            "prompt_token_ids", f"token id {bad} is out of range (vocabulary size {vocab_size})"
        )


def generate_response_to_pb(
    output: RequestOutput, worker_id: str
) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        request_id=output.request_id,
        token_ids=output.new_token_ids,
        text=output.new_text,
        finish_reason=FINISH_REASONS[output.finish_reason],
        num_prompt_tokens=output.num_prompt_tokens if output.finished else 0,
        num_output_tokens=output.num_output_tokens,
        worker_id=worker_id,
    )


def worker_info_to_pb(
    worker_id: str,
    model_ref: str,
    realized: RealizedReport,
    capability: Capability | None = None,
) -> worker_pb2.WorkerInfo:
    info = worker_pb2.WorkerInfo(
        worker_id=worker_id,
        model=model_ref,
        realized=realized_to_pb(realized.cache),
    )
    if capability is not None:
        info.capability.CopyFrom(capability_to_pb(capability))
    return info


def heartbeat_request_to_pb(worker_id: str, load: EngineLoad) -> worker_pb2.HeartbeatRequest:
    return worker_pb2.HeartbeatRequest(
        worker_id=worker_id,
        num_running=load.num_running,
        num_waiting=load.num_waiting,
        num_kv_used=load.num_kv_used,
        num_kv_total=load.num_kv_total,
    )
