"""The worker's one place where protobuf messages meet engine values (both directions).

Request errors are InvalidRequestError naming the proto field path (`stop.max_tokens`), so the
client reads the name of the field it set, not the engine's parameter name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from intentserve.convert import capability_to_pb, realized_to_pb
from intentserve.policy import Capability
from intentserve.v1 import inference_pb2, worker_pb2
from intentserve.worker.engine.chat import (
    ChatMessage,
    Conversation,
    Tool,
    ToolChoice,
    check_size,
)
from intentserve.worker.engine.constraint import FIELD, TOOL_CALL_KINDS, Constraint, ConstraintKind
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.engine.request import LogprobEntry, RequestOutput
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall
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
    "seed": "sampling.seed",
    "stop_token_ids": "stop.stop_token_ids",
    "presence_penalty": "sampling.presence_penalty",
    "frequency_penalty": "sampling.frequency_penalty",
    "repetition_penalty": "sampling.repetition_penalty",
    "min_p": "sampling.min_p",
    "logit_bias": "sampling.logit_bias",
    "logprobs": "sampling.logprobs",
    "prompt_logprobs": "sampling.prompt_logprobs",
    "min_tokens": "stop.min_tokens",
    **{
        f"{FIELD}.{f.name}": f"sampling.{FIELD}.{f.name}"
        for f in inference_pb2.OutputConstraint.DESCRIPTOR.oneofs_by_name["kind"].fields
    },
    FIELD: f"sampling.{FIELD}",
    # Their schema is the tools' parameters.
    **{f"{FIELD}.{kind.value}": "tools" for kind in TOOL_CALL_KINDS},
}

# Protobuf's wire types, as a refusal names them; a field it reads sent as another is unread.
WIRE_TYPES = {0: "a varint", 1: "64 bits", 2: "length-delimited", 5: "32 bits"}
_TYPE_NAMES = {
    number: name.removeprefix("TYPE_").lower()
    for name, number in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}

FINISH_REASONS = {
    None: inference_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: inference_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: inference_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: inference_pb2.FINISH_REASON_ABORT,
    FinishReason.TOOL_CALLS: inference_pb2.FINISH_REASON_TOOL_CALLS,
}
TOOL_CHOICES = {
    inference_pb2.TOOL_CHOICE_UNSPECIFIED: ToolChoice.AUTO,
    inference_pb2.TOOL_CHOICE_AUTO: ToolChoice.AUTO,
    inference_pb2.TOOL_CHOICE_NONE: ToolChoice.NONE,
    inference_pb2.TOOL_CHOICE_REQUIRED: ToolChoice.REQUIRED,
    inference_pb2.TOOL_CHOICE_FUNCTION: ToolChoice.FUNCTION,
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
        raise InvalidRequestError(path, error.field_violation.description) from None


@dataclass(frozen=True)
class GenerateCall:
    """A GenerateRequest as the engine takes it; the engine checks its content."""

    prompt: str | tuple[int, ...] | Conversation
    params: SamplingParams
    request_id: str | None  # None: the engine names it
    chat: bool
    n: int  # choices (0 on the wire is 1)


def generate_request_from_pb(msg: inference_pb2.GenerateRequest) -> GenerateCall:
    check_size(msg.messages, msg.tools)  # NOTE: first: reading 10^5 turns took 0.9 s
    _refuse_unknown_fields(msg)
    with proto_field_names():
        params = SamplingParams(
            max_tokens=msg.stop.max_tokens if msg.stop.HasField("max_tokens") else None,
            temperature=msg.sampling.temperature,
            top_k=msg.sampling.top_k,
            top_p=msg.sampling.top_p or 1.0,  # 0 means "not set"
            seed=msg.sampling.seed if msg.sampling.HasField("seed") else None,
            stop_token_ids=tuple(msg.stop.stop_token_ids),
            stop=tuple(msg.stop.stop),
            ignore_eos=msg.stop.ignore_eos,
            presence_penalty=msg.sampling.presence_penalty,
            frequency_penalty=msg.sampling.frequency_penalty,
            repetition_penalty=msg.sampling.repetition_penalty or 1.0,  # 0 means "not set"
            min_p=msg.sampling.min_p,
            min_tokens=msg.stop.min_tokens,
            logit_bias=tuple(sorted(msg.sampling.logit_bias.items())),
            logprobs=msg.sampling.logprobs if msg.sampling.HasField("logprobs") else None,
            prompt_logprobs=(
                msg.sampling.prompt_logprobs if msg.sampling.HasField("prompt_logprobs") else None
            ),
            constraint=_constraint_from_pb(msg.sampling.constraint),
            reasoning_budget=msg.reasoning_budget if msg.HasField("reasoning_budget") else None,
        )
        prompt = _prompt_from_pb(msg)
        forced = prompt.tool_call_constraint() if isinstance(prompt, Conversation) else None
        if forced is not None:
            if params.constraint is not None:
                raise InvalidRequestError(
                    "tool_choice",
                    "a required call holds the reply to it already; it cannot be combined "
                    "with sampling.constraint",
                )
            params = dataclasses.replace(params, constraint=forced)
    return GenerateCall(prompt, params, msg.request_id or None, msg.chat, num_choices(msg))


def num_choices(msg: inference_pb2.GenerateRequest) -> int:
    """The choices a GenerateRequest asks for: `n`, where 0 (unset) means one."""
    return msg.n or 1


@dataclass(frozen=True)
class TokenizeCall:
    """A TokenizeRequest as the engine takes it."""

    prompt: str | Conversation
    add_bos: bool | None  # None: the checkpoint's own choice
    return_token_strs: bool


def tokenize_request_from_pb(msg: inference_pb2.TokenizeRequest) -> TokenizeCall:
    check_size(msg.messages, msg.tools)  # NOTE: first: reading 10^5 turns took 0.9 s
    _refuse_unknown_fields(msg)
    if msg.messages:
        if msg.prompt:
            raise InvalidRequestError("messages", "give a conversation or a prompt, not both")
        prompt = _conversation_from_pb(msg, inference_pb2.TOOL_CHOICE_AUTO)
    else:
        _refuse_without_messages(msg, ("chat_template_kwargs", "tools"))
        prompt = msg.prompt
    add_bos = msg.add_special_tokens if msg.HasField("add_special_tokens") else None
    return TokenizeCall(prompt, add_bos, msg.return_token_strs)


def tokenize_response_to_pb(
    token_ids: list[int], token_strs: list[str], max_model_len: int
) -> inference_pb2.TokenizeResponse:
    return inference_pb2.TokenizeResponse(
        tokens=token_ids, token_strs=token_strs, max_model_len=max_model_len
    )


def detokenize_request_from_pb(msg: inference_pb2.DetokenizeRequest) -> tuple[int, ...]:
    _refuse_unknown_fields(msg)
    return tuple(msg.tokens)


def _conversation_from_pb(msg, tool_choice: int) -> Conversation:
    """A GenerateRequest's or TokenizeRequest's conversation (messages, chat_template_kwargs,
    tools) and `tool_choice`."""
    if tool_choice not in TOOL_CHOICES:
        raise InvalidRequestError(
            "tool_choice",
            f"{tool_choice} is not a ToolChoice; allowed: AUTO, NONE, REQUIRED, FUNCTION",
        )
    return Conversation(
        tuple(
            ChatMessage(
                m.role,
                m.content,
                tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                m.tool_call_id,
            )
            for m in msg.messages
        ),
        json_format.MessageToDict(msg.chat_template_kwargs),
        tuple(Tool(t.name, t.description, t.parameters) for t in msg.tools),
        TOOL_CHOICES[tool_choice],
        # A TokenizeRequest has no choice to make.
        getattr(msg, "tool_choice_function", ""),
        getattr(msg, "parallel_tool_calls", False),
    )


def _refuse_without_messages(msg, names: tuple[str, ...]) -> None:
    """The conversation's fields `names` of `msg`, set with no messages, are refused."""
    for name in names:
        if msg.HasField(name) if name == "chat_template_kwargs" else bool(getattr(msg, name)):
            raise InvalidRequestError(
                name, "applies to a conversation (messages), which was not given"
            )


def _constraint_from_pb(msg: inference_pb2.OutputConstraint) -> Constraint | None:
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_object":
        if not msg.json_object:
            raise InvalidRequestError(f"{FIELD}.json_object", "must be true when set")
        return Constraint(ConstraintKind.JSON_OBJECT)
    if kind == "choice":
        return Constraint(ConstraintKind.CHOICE, choices=tuple(msg.choice.choices))
    return Constraint(ConstraintKind(kind), getattr(msg, kind))


def _prompt_from_pb(msg: inference_pb2.GenerateRequest) -> str | tuple[int, ...] | Conversation:
    if msg.messages:
        if msg.prompt or msg.prompt_token_ids:
            raise InvalidRequestError(
                "messages", "give a conversation or a prompt (prompt, prompt_token_ids), not both"
            )
        return _conversation_from_pb(msg, msg.tool_choice)
    _refuse_without_messages(
        msg, ("chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls")
    )
    return tuple(msg.prompt_token_ids) if msg.prompt_token_ids else msg.prompt


def _refuse_unknown_fields(msg: Message, path: str = "") -> None:
    """A field this worker's GenerateRequest does not have (a newer client's) is refused by its
    number, never ignored: whatever it asked for would not be honoured. A field it has, sent with
    another wire type (which protobuf keeps aside, unread), is refused by its name."""
    unknown = UnknownFieldSet(msg)
    if len(unknown):
        number, sent = unknown[0].field_number, WIRE_TYPES.get(unknown[0].wire_type, "a group")
        field = msg.DESCRIPTOR.fields_by_number.get(number)
        if field is not None:
            kind = field.message_type.name if field.message_type else _TYPE_NAMES[field.type]
            raise InvalidRequestError(
                f"{path}{field.name}",
                f"sent as {sent}, but its type here is {kind}: not read, so refused (a client "
                "built from another version of the .proto?)",
            )
        raise InvalidRequestError(
            f"{path}#{number}",
            "this server does not know this field (a newer client's?): not honoured, so refused",
        )
    for descriptor, value in msg.ListFields():
        if descriptor.message_type is None or descriptor.message_type.GetOptions().map_entry:
            continue
        name = f"{path}{descriptor.name}"
        if descriptor.is_repeated:
            for i, item in enumerate(value):
                _refuse_unknown_fields(item, f"{name}[{i}].")
        elif descriptor.message_type.full_name != "google.protobuf.Struct":
            _refuse_unknown_fields(value, f"{name}.")


def generate_response_to_pb(
    output: RequestOutput, worker_id: str
) -> inference_pb2.GenerateResponse:
    return fill_generate_response(inference_pb2.GenerateResponse(), output, worker_id)


def fill_generate_response(
    msg: inference_pb2.GenerateResponse, output: RequestOutput, worker_id: str
) -> inference_pb2.GenerateResponse:
    """Set an empty GenerateResponse (one inside a StreamEvents, built in place) from `output`."""
    msg.request_id = output.request_id
    msg.token_ids.extend(output.new_token_ids)
    msg.text = output.new_text
    msg.reasoning = output.new_reasoning
    msg.num_reasoning_tokens = output.num_reasoning_tokens
    msg.finish_reason = FINISH_REASONS[output.finish_reason]
    if output.finished:
        msg.num_prompt_tokens = output.num_prompt_tokens
    msg.num_output_tokens = output.num_output_tokens
    msg.worker_id = worker_id
    msg.index = output.index
    msg.stop_string = output.stop_string
    for call in output.tool_calls:
        msg.tool_calls.add(id=call.id, name=call.name, arguments=call.arguments)
    for field, entries in (
        (msg.logprobs, output.logprobs),
        (msg.prompt_logprobs, output.prompt_logprobs),
    ):
        for logprobs in entries:
            entry = field.add()
            _entry_to_pb(entry.chosen, logprobs.chosen)
            for top in logprobs.top:
                _entry_to_pb(entry.top.add(), top)
    return msg


def _entry_to_pb(msg: inference_pb2.LogprobEntry, entry: LogprobEntry) -> None:
    msg.token_id, msg.token = entry.token_id, entry.token
    if entry.logprob is not None:
        msg.logprob = entry.logprob


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
        num_preemptions=load.num_preemptions,
        num_prefix_queried_tokens=load.num_prefix_queried_tokens,
        num_prefix_hit_tokens=load.num_prefix_hit_tokens,
        num_steps=load.num_steps,
        total_step_s=load.total_step_s,
        num_step_seqs=load.num_step_seqs,
    )
