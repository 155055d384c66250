"""Every GenerateRequest field is honoured (it reaches what the engine gets) or refused naming
it; a field this worker does not know (a newer client's) is refused by its number, never
ignored. And chat_template_kwargs reach the chat template."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2
from intentserve.v1 import inference_pb2
from intentserve.worker.engine.chat import Conversation, ToolChoice
from intentserve.worker.engine.constraint import Constraint, ConstraintKind
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.model.tokenizer import Tokenizer
from intentserve.worker.service.convert import generate_request_from_pb, tokenize_request_from_pb


def _kwargs() -> struct_pb2.Struct:
    kwargs = struct_pb2.Struct()
    kwargs.update({"enable_thinking": False})
    return kwargs


MESSAGES = [inference_pb2.ChatMessage(role="user", content="Hi")]
# Each field path: what to set, and what the engine must then get.
HONOURED = {
    "request_id": ({"request_id": "req-1"}, lambda c: c.request_id == "req-1"),
    "prompt": ({"prompt": "Hi"}, lambda c: c.prompt == "Hi"),
    "prompt_token_ids": ({"prompt_token_ids": [1, 2]}, lambda c: c.prompt == (1, 2)),
    "chat": ({"prompt": "Hi", "chat": True}, lambda c: c.chat),
    "messages": ({"messages": MESSAGES}, lambda c: c.prompt.messages[0].content == "Hi"),
    "chat_template_kwargs": (
        {"messages": MESSAGES, "chat_template_kwargs": _kwargs()},
        lambda c: dict(c.prompt.template_kwargs) == {"enable_thinking": False},
    ),
    "tools": (
        {"messages": MESSAGES, "tools": [inference_pb2.Tool(name="f", parameters="{}")]},
        lambda c: (
            [(t.name, t.parameters) for t in c.prompt.tools] == [("f", "{}")]
            and c.prompt.parses_tool_calls
        ),
    ),
    "tool_choice": (
        {
            "messages": MESSAGES,
            "tools": [inference_pb2.Tool(name="f")],
            "tool_choice": inference_pb2.TOOL_CHOICE_NONE,
        },
        lambda c: c.prompt.tool_choice is ToolChoice.NONE and not c.prompt.parses_tool_calls,
    ),
    "tool_choice_function": (
        {
            "messages": MESSAGES,
            "tools": [inference_pb2.Tool(name="f"), inference_pb2.Tool(name="g")],
            "tool_choice": inference_pb2.TOOL_CHOICE_FUNCTION,
            "tool_choice_function": "g",
        },
        lambda c: (
            c.prompt.tool_function == "g"
            and c.params.constraint.kind is ConstraintKind.TOOL_CALL
            and '"const": "g"' in c.params.constraint.text
        ),
    ),
    "parallel_tool_calls": (
        {
            "messages": MESSAGES,
            "tools": [inference_pb2.Tool(name="f")],
            "tool_choice": inference_pb2.TOOL_CHOICE_REQUIRED,
            "parallel_tool_calls": True,
        },
        lambda c: (
            c.prompt.parallel_tool_calls and c.params.constraint.kind is ConstraintKind.TOOL_CALLS
        ),
    ),
    "n": ({"prompt": "Hi", "n": 3}, lambda c: c.n == 3),
    "reasoning_budget": (
        {"messages": MESSAGES, "reasoning_budget": 0},
        lambda c: c.params.reasoning_budget == 0,
    ),
    "sampling.temperature": (
        {"sampling": {"temperature": 0.5}},
        lambda c: c.params.temperature == 0.5,
    ),
    "sampling.top_k": ({"sampling": {"top_k": 4}}, lambda c: c.params.top_k == 4),
    "sampling.top_p": ({"sampling": {"top_p": 0.5}}, lambda c: c.params.top_p == 0.5),
    "sampling.seed": ({"sampling": {"seed": 9}}, lambda c: c.params.seed == 9),
    "sampling.presence_penalty": (
        {"sampling": {"presence_penalty": 0.5}},
        lambda c: c.params.presence_penalty == 0.5,
    ),
    "sampling.frequency_penalty": (
        {"sampling": {"frequency_penalty": -0.5}},
        lambda c: c.params.frequency_penalty == -0.5,
    ),
    "sampling.repetition_penalty": (
        {"sampling": {"repetition_penalty": 1.5}},
        lambda c: c.params.repetition_penalty == 1.5,
    ),
    "sampling.min_p": ({"sampling": {"min_p": 0.25}}, lambda c: c.params.min_p == 0.25),
    "sampling.logit_bias": (
        {"sampling": {"logit_bias": {5: -100.0}}},
        lambda c: c.params.logit_bias == ((5, -100.0),),
    ),
    "sampling.logprobs": ({"sampling": {"logprobs": 0}}, lambda c: c.params.logprobs == 0),
    "sampling.prompt_logprobs": (
        {"sampling": {"prompt_logprobs": 3}},
        lambda c: c.params.prompt_logprobs == 3,
    ),
    "sampling.constraint.json_object": (
        {"sampling": {"constraint": {"json_object": True}}},
        lambda c: c.params.constraint == Constraint(ConstraintKind.JSON_OBJECT),
    ),
    "sampling.constraint.json_schema": (
        {"sampling": {"constraint": {"json_schema": '{"type": "integer"}'}}},
        lambda c: c.params.constraint == Constraint.json_schema({"type": "integer"}),
    ),
    "sampling.constraint.choice.choices": (
        {"sampling": {"constraint": {"choice": {"choices": ["a", "b"]}}}},
        lambda c: c.params.constraint == Constraint(ConstraintKind.CHOICE, choices=("a", "b")),
    ),
    "sampling.constraint.regex": (
        {"sampling": {"constraint": {"regex": "a+"}}},
        lambda c: c.params.constraint == Constraint(ConstraintKind.REGEX, "a+"),
    ),
    "sampling.constraint.grammar": (
        {"sampling": {"constraint": {"grammar": 'start: "yes" | "no"'}}},
        lambda c: c.params.constraint == Constraint(ConstraintKind.GRAMMAR, 'start: "yes" | "no"'),
    ),
    "stop.max_tokens": ({"stop": {"max_tokens": 3}}, lambda c: c.params.max_tokens == 3),
    "stop.stop_token_ids": (
        {"stop": {"stop_token_ids": [7]}},
        lambda c: c.params.stop_token_ids == (7,),
    ),
    "stop.stop": ({"stop": {"stop": ["x"]}}, lambda c: c.params.stop == ("x",)),
    "stop.ignore_eos": ({"stop": {"ignore_eos": True}}, lambda c: c.params.ignore_eos),
    "stop.min_tokens": ({"stop": {"min_tokens": 2}}, lambda c: c.params.min_tokens == 2),
}


def _paths(descriptor, prefix=""):
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        nested = field.message_type
        if (
            nested is not None
            and nested.full_name.startswith("intentserve.")
            and not (nested.GetOptions().map_entry or field.is_repeated)
        ):
            yield from _paths(nested, f"{path}.")
        else:
            yield path


def _request(fields: dict) -> inference_pb2.GenerateRequest:
    fields = {"prompt": "Hi", **fields} if "messages" not in fields else fields
    if "prompt_token_ids" in fields:
        fields.pop("prompt")
    sampling = inference_pb2.SamplingParams(**fields.pop("sampling", {}))
    stop = inference_pb2.StopConditions(**fields.pop("stop", {}))
    return inference_pb2.GenerateRequest(sampling=sampling, stop=stop, **fields)


def test_every_field_of_generate_request_is_listed_here():
    assert set(_paths(inference_pb2.GenerateRequest.DESCRIPTOR)) == set(HONOURED)


@pytest.mark.parametrize("path", sorted(HONOURED))
def test_each_field_reaches_the_engine(path):
    fields, reached = HONOURED[path]
    assert reached(generate_request_from_pb(_request(dict(fields))))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (bytes([0xF8, 0x07, 0x01]), "#127"),  # field 127 of GenerateRequest, a varint
        (bytes([0x22, 0x03, 0xF8, 0x07, 0x01]), "sampling.#127"),
        (bytes([0x2A, 0x03, 0xF8, 0x07, 0x01]), "stop.#127"),
    ],
)
def test_a_field_this_worker_does_not_know_is_refused_by_its_number(raw, field):
    msg = inference_pb2.GenerateRequest()
    msg.ParseFromString(inference_pb2.GenerateRequest(prompt="Hi").SerializeToString() + raw)
    with pytest.raises(InvalidRequestError) as info:
        generate_request_from_pb(msg)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("raw", "field", "sent"),
    [
        (bytes([0x10, 0x05]), "prompt", "a varint"),  # prompt (2), a string, sent as a number
        (bytes([0x22, 0x03, 0x0A, 0x01, 0x31]), "sampling.temperature", "length-delimited"),
    ],
)
def test_a_known_field_sent_with_another_wire_type_is_refused_naming_it(raw, field, sent):
    """Found by review: such a field was refused as unknown ("a newer client's?") by its
    number, where the client had set the field by its name."""
    msg = inference_pb2.GenerateRequest.FromString(raw)
    with pytest.raises(InvalidRequestError) as info:
        generate_request_from_pb(msg)
    assert info.value.field == field
    assert f"sent as {sent}" in str(info.value), str(info.value)


def test_a_tokenize_prompt_sent_with_another_wire_type_is_refused_naming_it():
    msg = inference_pb2.TokenizeRequest.FromString(bytes([0x08, 0x05]))  # prompt (1) as a number
    with pytest.raises(InvalidRequestError) as info:
        tokenize_request_from_pb(msg)
    assert info.value.field == "prompt"


@pytest.mark.parametrize(
    ("constraint", "field", "problem"),
    [
        ({"json_object": False}, "sampling.constraint.json_object", "must be true"),
        ({"json_schema": "{not json"}, "sampling.constraint.json_schema", "not valid JSON"),
        ({"json_schema": "[1]"}, "sampling.constraint.json_schema", "got list"),
        ({"choice": {"choices": ["a", ""]}}, "sampling.constraint.choice", "non-empty"),
        ({"regex": ""}, "sampling.constraint.regex", "must not be empty"),
    ],
)
def test_a_malformed_constraint_is_refused_naming_its_field(constraint, field, problem):
    msg = _request({"sampling": {"constraint": constraint}})
    with pytest.raises(InvalidRequestError) as info:
        generate_request_from_pb(msg)
    assert info.value.field == field
    assert problem in str(info.value)


def test_chat_template_kwargs_without_messages_are_refused_naming_them():
    msg = _request({"chat_template_kwargs": _kwargs()})
    with pytest.raises(InvalidRequestError) as info:
        generate_request_from_pb(msg)
    assert info.value.field == "chat_template_kwargs"


THINKING = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(tiny_loaded):
    base = tiny_loaded.tokenizer
    tokenizer = Tokenizer(
        base.backend,
        bos_token_id=base.bos_token_id,
        eos_token_ids=base.eos_token_ids,
        add_bos_token=False,
        chat_template=THINKING,
    )
    call = generate_request_from_pb(_request(dict(HONOURED["chat_template_kwargs"][0])))
    assert call.prompt.render(tokenizer) == "<user>Hi<assistant><think></think>"
    plain = generate_request_from_pb(_request({"messages": MESSAGES}))
    assert plain.prompt.render(tokenizer) == "<user>Hi<assistant>"


def test_template_variables_the_server_sets_are_refused_in_chat_template_kwargs():
    with pytest.raises(InvalidRequestError) as info:
        Conversation(Conversation.user("Hi").messages, {"add_generation_prompt": False})
    assert info.value.field == "chat_template_kwargs"
