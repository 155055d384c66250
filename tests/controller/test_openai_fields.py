"""No field of OpenAI's (or vLLM's) completions and chat request schemas is accepted and dropped:
each value that asks for something either reaches the GenerateRequest the worker gets, or is
refused with 400 naming it. A field no schema here knows is refused naming it too."""

from __future__ import annotations

import json

import pytest
from intentserve.controller.router.http.errors import from_unsupported, from_validation
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_convert import (
    chat_request_to_pb,
    completion_request_to_pb,
)
from intentserve.controller.router.http.openai_schema import CompletionRequest
from intentserve.v1 import inference_pb2
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from pydantic import ValidationError

MODEL = "smollm2-135m"
REFUSED = "refused"
ANY = "stream_options"  # checked with stream: true, below


def _bias(pb):
    return dict(pb.sampling.logit_bias) == {5: -100.0}


# Each field: a value that asks for something, and what must happen to it.
COMMON = {
    "model": (MODEL, lambda pb: True),  # the deployment's model; another is 404 (test_http_api)
    "max_tokens": (7, lambda pb: pb.stop.max_tokens == 7),
    "temperature": (0.5, lambda pb: pb.sampling.temperature == 0.5),
    "top_p": (0.5, lambda pb: pb.sampling.top_p == 0.5),
    "seed": (3, lambda pb: pb.sampling.seed == 3),
    "stop": (["x"], lambda pb: list(pb.stop.stop) == ["x"]),
    "n": (2, lambda pb: pb.n == 2),  # the worker forks the choices
    "stream": (True, lambda pb: True),  # the reply's shape (test_http_api streams)
    "stream_options": ({"include_usage": True}, lambda pb: True),
    "presence_penalty": (0.5, lambda pb: pb.sampling.presence_penalty == 0.5),
    "frequency_penalty": (0.5, lambda pb: pb.sampling.frequency_penalty == 0.5),
    "logit_bias": ({"5": -100}, _bias),
    "user": ("me", lambda pb: True),  # a label for the client's own accounting; asks nothing
}
# vLLM's extra sampling and decoding fields (its `extra_body`), honoured or refused.
VLLM = {
    "top_k": (5, lambda pb: pb.sampling.top_k == 5),
    "min_p": (0.1, lambda pb: abs(pb.sampling.min_p - 0.1) < 1e-6),
    "repetition_penalty": (1.2, lambda pb: abs(pb.sampling.repetition_penalty - 1.2) < 1e-6),
    "min_tokens": (3, lambda pb: pb.stop.min_tokens == 3),
    "stop_token_ids": ([7], lambda pb: list(pb.stop.stop_token_ids) == [7]),
    "ignore_eos": (True, lambda pb: pb.stop.ignore_eos),
    "use_beam_search": (True, REFUSED),
    "length_penalty": (2.0, REFUSED),
    "include_stop_str_in_output": (True, REFUSED),
    "skip_special_tokens": (False, REFUSED),
    "spaces_between_special_tokens": (False, REFUSED),
    "truncate_prompt_tokens": (5, REFUSED),
    "allowed_token_ids": ([1, 2], REFUSED),
    "prompt_logprobs": (1, REFUSED),
    "bad_words": (["x"], REFUSED),
    "add_special_tokens": (False, REFUSED),
    "guided_json": ({"type": "object"}, REFUSED),
    "guided_regex": ("a+", REFUSED),
    "guided_choice": (["a"], REFUSED),
    "guided_grammar": ("root ::= 'a'", REFUSED),
    "guided_decoding_backend": ("xgrammar", REFUSED),
    "structured_outputs": ({"regex": "a"}, lambda pb: pb.sampling.constraint.regex == "a"),
    "priority": (1, REFUSED),
    "request_id": ("mine", REFUSED),
    "logits_processors": (["x"], REFUSED),
    "return_tokens_as_token_ids": (True, REFUSED),
    "cache_salt": ("s", REFUSED),
}
COMPLETIONS = {
    "prompt": ("Hi", lambda pb: pb.prompt == "Hi"),
    "best_of": (2, REFUSED),
    "echo": (True, lambda pb: True),  # the prompt before the text (test_openai_mapping)
    "logprobs": (2, lambda pb: pb.sampling.HasField("logprobs") and pb.sampling.logprobs == 2),
    "suffix": ("end", REFUSED),
    "response_format": ({"type": "json_object"}, lambda pb: pb.sampling.constraint.json_object),
    "tool_choice": ("auto", REFUSED),
}
CHAT = {
    "messages": ([{"role": "user", "content": "Hi"}], lambda pb: pb.messages[0].content == "Hi"),
    "max_completion_tokens": (9, lambda pb: pb.stop.max_tokens == 9),
    "logprobs": (True, lambda pb: pb.sampling.HasField("logprobs") and pb.sampling.logprobs == 0),
    "top_logprobs": (3, REFUSED),  # without logprobs: true (with it, below)
    "audio": ({"voice": "alloy", "format": "mp3"}, REFUSED),
    "function_call": ("auto", REFUSED),
    "functions": ([{"name": "f"}], REFUSED),
    "metadata": ({"k": "v"}, REFUSED),
    "modalities": (["text", "audio"], REFUSED),
    "moderation": ({"type": "auto"}, REFUSED),
    # Without tools there is no call to hold to one (refused with tools under auto, below).
    "parallel_tool_calls": (False, lambda pb: not pb.parallel_tool_calls),
    "prediction": ({"type": "content", "content": "x"}, REFUSED),
    "prompt_cache_key": ("k", REFUSED),
    "prompt_cache_options": ({}, REFUSED),
    "prompt_cache_retention": ("24h", REFUSED),
    "reasoning_effort": ("low", lambda pb: pb.reasoning_budget == 1024),
    "response_format": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}},
        lambda pb: json.loads(pb.sampling.constraint.json_schema) == {"type": "integer"},
    ),
    "safety_identifier": ("me", lambda pb: True),  # a label, as `user`
    "service_tier": ("flex", REFUSED),
    "store": (True, REFUSED),
    "tool_choice": ("anything", REFUSED),  # auto, none, required and a named one pass, below
    "tools": (
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        lambda pb: [(t.name, t.parameters) for t in pb.tools] == [("f", '{"type": "object"}')],
    ),
    "verbosity": ("low", REFUSED),
    "web_search_options": ({}, REFUSED),
    "chat_template_kwargs": (
        {"enable_thinking": False},
        lambda pb: dict(pb.chat_template_kwargs) == {"enable_thinking": False},
    ),
    "echo": (True, REFUSED),
    "add_generation_prompt": (False, REFUSED),
    "continue_final_message": (True, REFUSED),
    "chat_template": ("{{ x }}", REFUSED),
    "documents": ([{"text": "x"}], REFUSED),
}
SCHEMAS = {
    "completions": (CompletionRequest, completion_request_to_pb, {**COMMON, **VLLM, **COMPLETIONS}),
    "chat": (ChatCompletionRequest, chat_request_to_pb, {**COMMON, **VLLM, **CHAT}),
}


def _body(kind: str, name: str, value) -> dict:
    base = {"model": MODEL}
    base.update({"prompt": "Hi"} if kind == "completions" else {"messages": CHAT["messages"][0]})
    if name == "stream_options":
        base["stream"] = True
    base[name] = value
    return base


def _outcome(kind: str, body: dict):
    """The GenerateRequest, or the refused parameter's name."""
    schema, to_pb, _ = SCHEMAS[kind]
    try:
        request = schema.model_validate(body)
    except ValidationError as error:
        return from_validation(error)
    unsupported = request.unsupported()
    if unsupported is not None:
        return from_unsupported(unsupported)
    return to_pb(request)


def test_every_published_openai_field_is_listed_here():
    """The lists above cover every field of the installed `openai` package's typed params."""
    published = {
        "completions": set(completion_create_params.CompletionCreateParamsBase.__annotations__),
        "chat": set(chat_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"},
    }
    for kind, fields in published.items():
        assert fields - {"stream"} <= set(SCHEMAS[kind][2]), kind


@pytest.mark.parametrize(
    ("kind", "name"), [(kind, name) for kind, (_, _, fields) in SCHEMAS.items() for name in fields]
)
def test_each_field_is_honoured_or_refused_naming_it(kind, name):
    value, expected = SCHEMAS[kind][2][name]
    outcome = _outcome(kind, _body(kind, name, value))
    if expected == REFUSED:
        assert not hasattr(outcome, "sampling"), f"{name} was accepted"
        assert (outcome.status, outcome.param) == (400, name)
        assert outcome.message.startswith(f"{name}: ")
    else:
        assert hasattr(outcome, "sampling"), f"{name} was refused: {outcome.message}"
        assert expected(outcome), f"{name} did not reach the GenerateRequest"


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_a_field_no_schema_knows_is_refused_naming_it(kind):
    outcome = _outcome(kind, _body(kind, "frobnicate", 1))
    assert (outcome.status, outcome.param) == (400, "frobnicate")
    assert "not honoured" in outcome.message


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, "TOOL_CHOICE_UNSPECIFIED"),
        ("auto", "TOOL_CHOICE_AUTO"),
        ("none", "TOOL_CHOICE_NONE"),
        ("required", "TOOL_CHOICE_REQUIRED"),
        ({"type": "function", "function": {"name": "f"}}, "TOOL_CHOICE_FUNCTION"),
    ],
)
def test_tool_choice_reaches_the_request(choice, expected):
    body = _body("chat", "tools", CHAT["tools"][0]) | {"tool_choice": choice}
    request = _outcome("chat", body)
    assert request.tool_choice == inference_pb2.ToolChoice.Value(expected)
    assert request.tool_choice_function == ("f" if isinstance(choice, dict) else "")


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("required", None, True),  # OpenAI's default
        ("required", True, True),
        ("required", False, False),
        ({"type": "function", "function": {"name": "f"}}, False, False),
        ("auto", None, True),
        ("none", False, False),
    ],
)
def test_parallel_tool_calls_reaches_the_request(choice, parallel, expected):
    body = _body("chat", "tools", CHAT["tools"][0]) | {"tool_choice": choice}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    assert _outcome("chat", body).parallel_tool_calls is expected


@pytest.mark.parametrize("choice", [None, "auto"])
def test_one_call_under_tool_choice_auto_is_refused_naming_parallel_tool_calls(choice):
    body = _body("chat", "tools", CHAT["tools"][0]) | {"parallel_tool_calls": False}
    if choice is not None:
        body["tool_choice"] = choice
    outcome = _outcome("chat", body)
    assert (outcome.status, outcome.param) == (400, "parallel_tool_calls")
    assert "tool_choice 'required' or a named function" in outcome.message


@pytest.mark.parametrize(
    "choice",
    [
        "always",
        {"type": "function"},
        {"type": "function", "function": {"name": 3}},
        {"type": "function", "function": {"name": "f", "strict": True}},
    ],
)
def test_a_tool_choice_of_another_shape_is_refused_naming_it(choice):
    outcome = _outcome("chat", _body("chat", "tools", CHAT["tools"][0]) | {"tool_choice": choice})
    assert (outcome.status, outcome.param) == (400, "tool_choice")
    assert "allowed: 'auto', 'none', 'required'" in outcome.message


def test_a_strict_function_is_refused_naming_it():
    tools = [{"type": "function", "function": {"name": "f", "strict": True}}]
    outcome = _outcome("chat", _body("chat", "tools", tools))
    assert (outcome.status, outcome.param) == (400, "tools[0].function.strict")


def test_an_assistant_turns_calls_and_a_tool_turn_reach_the_request():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    pb = _outcome("chat", {"model": MODEL, "messages": messages})
    assert [(c.id, c.name, c.arguments) for c in pb.messages[1].tool_calls] == [
        ("call_1", "f", "{}")
    ]
    assert (pb.messages[2].role, pb.messages[2].tool_call_id) == ("tool", "call_1")


def test_chat_top_logprobs_with_logprobs_reaches_the_request():
    pb = _outcome("chat", _body("chat", "top_logprobs", 3) | {"logprobs": True})
    assert pb.sampling.logprobs == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "bob"), ("function_call", {"name": "f", "arguments": "{}"}), ("audio", {})],
)
def test_a_message_field_that_asks_for_something_is_refused_naming_it(field, value):
    messages = [{"role": "user", "content": "Hi", field: value}]
    outcome = _outcome("chat", {"model": MODEL, "messages": messages})
    assert (outcome.status, outcome.param) == (400, f"messages[0].{field}")


def test_a_reply_sent_back_as_a_message_passes_with_its_empty_fields():
    """What the SDK's message object dumps (`refusal: null`, ...) asks for nothing."""
    message = {"role": "assistant", "content": "4", "refusal": None, "tool_calls": None}
    message |= {"function_call": None, "audio": None, "annotations": []}
    outcome = _outcome("chat", {"model": MODEL, "messages": [message]})
    assert hasattr(outcome, "sampling"), outcome.message


@pytest.mark.parametrize(
    ("kind", "name", "value"),
    [
        ("chat", "tool_choice", "none"),
        ("chat", "tool_choice", "auto"),
        ("chat", "parallel_tool_calls", True),
        ("completions", "tool_choice", "none"),
        ("chat", "response_format", {"type": "text"}),
        ("completions", "response_format", {"type": "text"}),
        ("chat", "store", False),
        ("chat", "modalities", ["text"]),
        ("chat", "n", 1),
        ("completions", "echo", False),
    ],
)
def test_a_value_that_asks_for_what_is_done_anyway_passes(kind, name, value):
    assert hasattr(_outcome(kind, _body(kind, name, value)), "sampling")


@pytest.mark.parametrize(
    ("kind", "body", "reached"),
    [
        (
            "chat",
            {"structured_outputs": {"json": {"type": "integer"}}},
            lambda c: json.loads(c.json_schema) == {"type": "integer"},
        ),
        (
            "completions",
            {"structured_outputs": {"json": '{"type": "string"}'}},
            lambda c: c.json_schema == '{"type": "string"}',
        ),
        (
            "chat",
            {"structured_outputs": {"choice": ["yes", "no"]}},
            lambda c: list(c.choice.choices) == ["yes", "no"],
        ),
        ("completions", {"structured_outputs": {"json_object": True}}, lambda c: c.json_object),
        (
            "completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {}},
                }
            },
            lambda c: json.loads(c.json_schema) == {},
        ),
    ],
)
def test_each_structured_output_form_reaches_the_request(kind, body, reached):
    pb = _outcome(kind, _body(kind, "model", MODEL) | body)
    assert hasattr(pb, "sampling"), pb.message
    assert reached(pb.sampling.constraint)


def test_a_free_grammar_reaches_the_request():
    """Issue 53 item 5: `structured_outputs.grammar` was refused naming it."""
    for kind in ("chat", "completions"):
        pb = _outcome(kind, _body(kind, "structured_outputs", {"grammar": "root ::= 'a'"}))
        assert hasattr(pb, "sampling"), pb.message
        assert pb.sampling.constraint.grammar == "root ::= 'a'"


def test_vllms_other_structured_output_options_are_refused_naming_them():
    body = _body("chat", "structured_outputs", {"structural_tag": "{}"})
    outcome = _outcome("chat", body)
    assert (outcome.status, outcome.param) == (400, "structured_outputs.structural_tag")


def test_readme_lists_every_field_here():
    """README's HTTP section says, for each field above, honoured or refused."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## HTTP API and metrics") : readme.index("### Metrics")]
    fields = {name for _, _, listed in SCHEMAS.values() for name in listed}
    missing = sorted(f for f in fields if f"`{f}`" not in section and not f.startswith("guided_"))
    assert missing == []
