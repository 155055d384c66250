"""OpenAI request bodies -> GenerateRequest, errors -> OpenAI's shape and HTTP status, responses
-> OpenAI's objects; no server."""

from __future__ import annotations

import grpc
import pytest
from intentserve.common.field_errors import FieldViolation
from intentserve.controller.errors import (
    NotReady,
    Overloaded,
    UpstreamError,
    WorkerUnavailable,
)
from intentserve.controller.router.http.errors import (
    from_routing,
    from_unsupported,
    from_validation,
)
from intentserve.controller.router.http.openai_chat_schema import ChatCompletionRequest
from intentserve.controller.router.http.openai_convert import (
    chat_request_to_pb,
    completion_request_to_pb,
    param_of,
)
from intentserve.controller.router.http.openai_reply import Reply
from intentserve.controller.router.http.openai_schema import CompletionRequest
from intentserve.policy import Reason, ReasonCode
from intentserve.v1 import inference_pb2
from pydantic import ValidationError

MODEL = "smollm2-135m"


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": MODEL, "prompt": "Hi", **fields})


def chat(**fields) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "Hi"}]
    return ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages, **fields})


def test_a_completion_carries_every_field_to_the_generate_request():
    pb = completion_request_to_pb(
        completion(
            max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="\n", top_k=5, ignore_eos=True
        )
    )
    assert pb.prompt == "Hi" and not pb.messages and not pb.chat
    assert pb.request_id.startswith("req-")
    assert pb.stop.max_tokens == 7 and list(pb.stop.stop) == ["\n"] and pb.stop.ignore_eos
    assert pb.sampling.temperature == pytest.approx(0.5) and pb.sampling.top_p == pytest.approx(0.9)
    assert pb.sampling.seed == 3 and pb.sampling.top_k == 5


def test_completion_defaults_are_openais():
    pb = completion_request_to_pb(completion())
    assert pb.stop.max_tokens == 16  # OpenAI's default for completions
    assert pb.sampling.temperature == 1.0  # OpenAI's default; 0 is greedy
    assert pb.sampling.top_p == 0.0 and not pb.sampling.HasField("seed")  # "not set"
    assert pb.sampling.top_k == 0 and list(pb.stop.stop) == []


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [
        ("Hi", "Hi", []),
        (["Hi"], "Hi", []),
        ([1, 2, 3], "", [1, 2, 3]),
        ([[4, 5]], "", [4, 5]),
    ],
)
def test_prompts_are_text_or_token_ids_or_a_batch_of_one(prompt, text, ids):
    pb = completion_request_to_pb(completion(prompt=prompt))
    assert (pb.prompt, list(pb.prompt_token_ids)) == (text, ids)


def test_a_chat_sends_every_turn_for_the_worker_to_template():
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}],
        },
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    pb = chat_request_to_pb(chat(messages=messages, stop=["a", "b"], top_k=-1))
    assert [(m.role, m.content) for m in pb.messages] == [
        ("system", "Be brief."),
        ("user", "2+2?"),
        ("assistant", "4"),
        ("user", "And 3+3?"),
    ]
    assert not pb.prompt and list(pb.stop.stop) == ["a", "b"] and pb.sampling.top_k == 0


def test_a_chat_without_a_limit_may_fill_the_model_length():
    assert not chat_request_to_pb(chat()).stop.HasField("max_tokens")
    assert chat_request_to_pb(chat(max_tokens=5)).stop.max_tokens == 5
    assert chat_request_to_pb(chat(max_tokens=5, max_completion_tokens=9)).stop.max_tokens == 9


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (lambda: completion(best_of=3), "best_of"),
        (lambda: chat(echo=True), "echo"),
        (lambda: completion(prompt=["a", "b"]), "prompt"),
        (lambda: completion(stream_options={"include_usage": True}), "stream_options"),
        (lambda: completion(repetition_penalty=0), "repetition_penalty"),
        (lambda: chat(top_logprobs=2), "top_logprobs"),
        (lambda: chat(tool_choice="whichever"), "tool_choice"),
        (lambda: chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
        (
            lambda: chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
        ),
        (
            lambda: completion(
                response_format={"type": "json_object"}, structured_outputs={"regex": "a"}
            ),
            "structured_outputs",
        ),
        (lambda: chat(structured_outputs={}), "structured_outputs"),
        (lambda: chat(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs"),
        (
            lambda: completion(structured_outputs={"json_object": False}),
            "structured_outputs.json_object",
        ),
        (lambda: completion(top_p=0), "top_p"),
        (lambda: chat(top_p=0.0), "top_p"),
    ],
)
def test_what_is_not_honoured_is_refused_naming_it(body, param):
    error = from_unsupported(body().unsupported())
    assert (error.status, error.param) == (400, param)
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_what_is_honoured_or_changes_nothing_passes():
    assert completion(n=1, best_of=1, logprobs=None, user="me").unsupported() is None
    assert (
        chat(response_format={"type": "text"}, stream=True, stream_options={}).unsupported() is None
    )


@pytest.mark.parametrize(
    ("schema", "fields", "param"),
    [
        (CompletionRequest, {"prompt": "Hi", "temperature": "hot"}, "temperature"),
        (CompletionRequest, {"prompt": "Hi", "max_tokens": -1}, "max_tokens"),
        (CompletionRequest, {"prompt": "Hi", "seed": -5}, "seed"),
        (CompletionRequest, {"prompt": 5}, "prompt"),
        (CompletionRequest, {}, "prompt"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
        ),
        (ChatCompletionRequest, {"messages": [{"content": "x"}]}, "messages[0].role"),
        (ChatCompletionRequest, {"messages": [], "stream_options": 1}, "stream_options"),
    ],
)
def test_a_body_of_the_wrong_shape_names_the_parameter(schema, fields, param):
    with pytest.raises(ValidationError) as info:
        schema.model_validate({"model": MODEL, **fields})
    error = from_validation(info.value)
    assert (error.status, error.param) == (400, param)
    assert error.message.startswith(f"{param}: ")


@pytest.mark.parametrize(
    ("details", "body", "param"),
    [
        ("sampling.temperature: must be >= 0, got -1.0", completion(), "temperature"),
        ("sampling.top_p: must be in (0, 1], got 1.5", chat(), "top_p"),
        ("stop.max_tokens: 900 does not fit", completion(), "max_tokens"),
        (
            "stop.max_tokens: 900 does not fit",
            chat(max_completion_tokens=900),
            "max_completion_tokens",
        ),
        ("stop.stop: stop strings must not be empty", chat(), "stop"),
        ("prompt: has 3000 tokens", completion(), "prompt"),
        ("prompt: has 3000 tokens", chat(), "messages"),
        (
            "messages[1].role: 'robot' is not one of system, user, assistant, tool",
            chat(),
            "messages[1].role",
        ),
        (
            "messages[1].tool_calls[0].arguments: is not JSON",
            chat(),
            "messages[1].tool_calls[0].function.arguments",
        ),
        ("tools[0].parameters: must be a JSON object", chat(), "tools[0].function.parameters"),
        ("tools[2].name: must not be empty", chat(), "tools[2].function.name"),
        ("tools: this model's chat template never reads `tools`", chat(), "tools"),
        ("prompt_token_ids: ids [99999] are outside the vocabulary", completion(), "prompt"),
        (
            "sampling.constraint.regex: invalid regex",
            chat(structured_outputs={"regex": "a("}),
            "structured_outputs",
        ),
        (
            "sampling.constraint.json_schema: Invalid type: foo",
            completion(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            ),
            "response_format",
        ),
    ],
)
def test_the_workers_invalid_argument_names_the_openai_parameter(details, body, param):
    field, _, description = details.partition(": ")
    violation = FieldViolation(field, description)
    error = from_routing(UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, details, violation), body)
    assert (error.status, error.param, error.code) == (400, param, "invalid_argument")
    assert error.message == f"{param}: {description}"


def test_a_message_without_a_field_detail_is_not_read_for_a_field():
    """The field comes from the worker's BadRequest detail, never from the message's text."""
    details = "stop.max_tokens: 900 does not fit"
    error = from_routing(UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, details), completion())
    assert (error.status, error.param, error.message) == (400, None, details)


def test_an_unknown_field_path_is_relayed_without_a_param():
    error = from_routing(UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, "whatever"), chat())
    assert (error.status, error.param, error.message) == (400, None, "whatever")


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (NotReady(Reason(ReasonCode.WORKER_PENDING, "loading")), 503, "worker_pending"),
        (Overloaded("every queue is full"), 429, "resource_exhausted"),
        (WorkerUnavailable("worker w0 was lost"), 503, "unavailable"),
        (UpstreamError(grpc.StatusCode.INTERNAL, "boom"), 500, "internal"),
        (RuntimeError("bug"), 500, "internal"),
    ],
)
def test_routing_failures_get_the_status_grpc_clients_get_too(error, status, code):
    mapped = from_routing(error, completion())
    assert (mapped.status, mapped.code, mapped.param) == (status, code, None)
    assert set(mapped.body()["error"]) == {"message", "type", "param", "code"}


def test_not_ready_carries_the_readiness_reason():
    error = from_routing(NotReady(Reason(ReasonCode.NOT_ENOUGH_REPLICAS, "0 of 1")), chat())
    assert error.message == "deployment is not ready: not_enough_replicas: 0 of 1"
    assert error.body()["error"]["type"] == "service_unavailable_error"


def response(text: str, num_output: int, finish: int = 0, num_prompt: int = 0):
    return inference_pb2.GenerateResponse(
        text=text,
        token_ids=[1],
        num_output_tokens=num_output,
        finish_reason=finish,
        num_prompt_tokens=num_prompt,
    )


@pytest.mark.parametrize("is_chat", [False, True])
def test_a_reply_collects_its_responses_with_the_usage(is_chat):
    reply = Reply(is_chat, MODEL, "req-1")
    assert reply.add(response("Par", 1)) == ("Par", None)
    assert reply.add(response("is", 2, inference_pb2.FINISH_REASON_STOP, 5)) == ("is", "stop")
    whole = reply.response()
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    if is_chat:
        assert whole["object"] == "chat.completion" and whole["id"] == "chatcmpl-req-1"
        assert choice["message"] == {"role": "assistant", "content": "Paris"}
    else:
        assert whole["object"] == "text_completion" and whole["id"] == "cmpl-req-1"
        assert choice["text"] == "Paris"


def test_chat_chunks_say_who_speaks_first_and_end_with_an_empty_delta():
    reply = Reply(True, MODEL, "req-1")
    assert reply.chunk("", None, first=True)["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    assert reply.chunk("Hi", None)["choices"][0]["delta"] == {"content": "Hi"}
    last = reply.chunk("", "length")["choices"][0]
    assert (last["delta"], last["finish_reason"]) == ({}, "length")
    usage = reply.usage_chunk()
    assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk"


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (
            [
                {"type": "text", "text": "Describe"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
            "part 1 is of type 'image_url'; allowed: text parts (this deployment serves a text "
            "model)",
        ),
        (
            [{"type": "input_audio", "input_audio": {}}],
            "part 0 is of type 'input_audio'; allowed: text parts (this deployment serves a text "
            "model)",
        ),
        (
            ["just a string"],
            "part 0 is of type None; allowed: text parts (this deployment serves a text model)",
        ),
    ],
)
def test_a_part_that_is_not_text_is_refused_naming_it(parts, message):
    """Not pydantic's 'Input should be a valid string' from the other member of the union."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}]}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    error = from_validation(info.value)
    assert (error.status, error.param) == (400, "messages[0].content")
    assert error.message == f"messages[0].content: {message}"


def test_top_p_0_is_refused_not_read_as_unset():
    """Found trying it: `top_p: 0` (the narrowest nucleus) went on the wire as 0, which means
    "not set", and so sampled from the whole distribution."""
    error = from_unsupported(completion(top_p=0).unsupported())
    assert error.message == (
        "top_p: 0 is outside (0, 1]; allowed: (0, 1], or leave it out for 1 "
        "(for greedy decoding, send temperature 0)"
    )
    assert completion(top_p=1e-9).unsupported() is None


def _with_logprobs(text: str, tokens: list[tuple[str, float]], finish=0):
    response = inference_pb2.GenerateResponse(text=text, finish_reason=finish)
    for i, (token, logprob) in enumerate(tokens):
        entry = response.logprobs.add()
        entry.chosen.token_id, entry.chosen.token, entry.chosen.logprob = i, token, logprob
        alt = entry.top.add()
        alt.token_id, alt.token, alt.logprob = 99, "?", logprob - 1
    return response


def test_completion_logprobs_take_openais_shape():
    reply = Reply(False, MODEL, "r", with_logprobs=True)
    reply.add(_with_logprobs(" Paris.", [(" Paris", -0.5), (".", -1.0)], finish=1))
    logprobs = reply.response()["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": [" Paris", "."],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"?": -1.5}, {"?": -2.0}],
        "text_offset": [0, 6],
    }


def test_chat_logprobs_take_openais_shape_and_each_chunk_carries_its_own():
    reply = Reply(True, MODEL, "r", with_logprobs=True)
    reply.add(_with_logprobs("Hi", [("Hi", -0.25)]))
    first = reply.chunk("Hi", None)["choices"][0]["logprobs"]["content"]
    assert first == [
        {
            "token": "Hi",
            "logprob": -0.25,
            "bytes": [72, 105],
            "top_logprobs": [{"token": "?", "logprob": -1.25, "bytes": [63]}],
        }
    ]
    reply.add(_with_logprobs("!", [("!", -2.0)], finish=1))
    second = reply.chunk("!", "stop")["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in second] == ["!"]


def test_without_logprobs_asked_the_choice_says_null():
    reply = Reply(True, MODEL, "r")
    reply.add(inference_pb2.GenerateResponse(text="x", finish_reason=1))
    assert reply.response()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("n", "on_the_wire"), [(None, 1), (1, 1), (3, 3)])
def test_n_choices_are_one_request_of_n(n, on_the_wire):
    """The worker forks the choices from one prompt (and seeds choice i with seed + i)."""
    pb = completion_request_to_pb(completion(n=n, seed=2**64 - 2))
    assert (pb.n, pb.sampling.seed, pb.prompt) == (on_the_wire, 2**64 - 2, "Hi")
    assert chat_request_to_pb(chat(n=n)).n == on_the_wire


def test_a_worker_refusing_a_grammar_names_structured_outputs_grammar():
    body = chat(structured_outputs={"grammar": "start: ("})
    assert param_of("sampling.constraint.grammar", body) == "structured_outputs.grammar"
    assert param_of("sampling.constraint.regex", chat(structured_outputs={"regex": "("})) == (
        "structured_outputs"
    )


def test_a_worker_refusing_n_past_its_max_num_seqs_names_param_n():
    assert param_of("n", completion()) == "n" and param_of("n", chat()) == "n"


def test_n_replies_merge_into_one_response_with_indexed_choices():
    from intentserve.controller.router.http.openai_reply import merged_response

    replies = [Reply(True, MODEL, "req-1", index=i) for i in range(2)]
    for i, reply in enumerate(replies):
        reply.add(
            inference_pb2.GenerateResponse(
                text=f"t{i}", finish_reason=1, num_prompt_tokens=5, num_output_tokens=i + 1
            )
        )
    body = merged_response(replies)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == ["t0", "t1"]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert replies[1].chunk("x", None)["choices"][0]["index"] == 1


@pytest.mark.parametrize("n", [0, 17])
def test_n_outside_1_to_16_is_refused_naming_it(n):
    error = from_unsupported(chat(n=n).unsupported())
    assert (error.status, error.param) == (400, "n")


def test_echo_asks_for_prompt_logprobs_only_when_it_needs_them():
    assert not completion_request_to_pb(completion(echo=True)).sampling.HasField("prompt_logprobs")
    scored = completion_request_to_pb(completion(echo=True, logprobs=2)).sampling
    assert scored.prompt_logprobs == 2 and scored.logprobs == 2
    ids = completion_request_to_pb(completion(echo=True, prompt=[5, 6])).sampling
    assert ids.HasField("prompt_logprobs") and ids.prompt_logprobs == 0


def test_echo_puts_the_prompt_and_its_scores_before_the_completion():
    reply = Reply(False, MODEL, "r", with_logprobs=True, echo=True)
    first = _with_logprobs(" Paris", [(" Paris", -0.5)])
    head = first.prompt_logprobs.add()
    head.chosen.token_id, head.chosen.token = 1, "The"
    second = first.prompt_logprobs.add()
    second.chosen.token_id, second.chosen.token, second.chosen.logprob = 2, " capital", -3.0
    reply.add(first)
    reply.add(inference_pb2.GenerateResponse(text="", finish_reason=2))
    choice = reply.response()["choices"][0]
    assert choice["text"] == "The capital Paris"
    assert choice["logprobs"]["tokens"] == ["The", " capital", " Paris"]
    assert choice["logprobs"]["token_logprobs"] == [None, -3.0, -0.5]
    assert choice["logprobs"]["top_logprobs"][0] is None
    assert choice["logprobs"]["text_offset"] == [0, 3, 11]


def test_echo_of_a_text_prompt_without_logprobs_is_the_prompt_itself():
    reply = Reply(False, MODEL, "r", echo=True, echo_text="Hi there")
    text, finish = reply.add(inference_pb2.GenerateResponse(text="!", finish_reason=1))
    assert reply.chunk(text, finish)["choices"][0]["text"] == "Hi there!"
    assert reply.response()["choices"][0]["text"] == "Hi there!"


def _calls(*names: str) -> list[inference_pb2.ToolCall]:
    return [inference_pb2.ToolCall(id=f"call_{n}", name=n, arguments='{"x": 1}') for n in names]


def test_a_reply_with_tool_calls_has_them_and_null_content():
    reply = Reply(True, MODEL, "r")
    reply.add(inference_pb2.GenerateResponse(tool_calls=_calls("a")))
    reply.add(
        inference_pb2.GenerateResponse(
            tool_calls=_calls("b"), finish_reason=inference_pb2.FINISH_REASON_TOOL_CALLS
        )
    )
    choice = reply.response()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": n, "arguments": '{"x": 1}'},
            }
            for n in ("a", "b")
        ],
    }


def test_a_reply_with_text_and_calls_keeps_the_text():
    reply = Reply(True, MODEL, "r")
    reply.add(inference_pb2.GenerateResponse(text="Let me look.", tool_calls=_calls("a")))
    message = reply.response()["choices"][0]["message"]
    assert message["content"] == "Let me look." and len(message["tool_calls"]) == 1


def test_streamed_calls_go_out_once_each_with_their_index():
    reply = Reply(True, MODEL, "r")
    deltas = []
    for response in (
        inference_pb2.GenerateResponse(text="Hm."),
        inference_pb2.GenerateResponse(tool_calls=_calls("a", "b")),
        inference_pb2.GenerateResponse(tool_calls=_calls("c")),
        inference_pb2.GenerateResponse(finish_reason=inference_pb2.FINISH_REASON_TOOL_CALLS),
    ):
        text, finish = reply.add(response)
        assert text or finish or reply.has_unsent_calls
        deltas.append(reply.chunk(text, finish)["choices"][0])
    assert deltas[0]["delta"] == {"content": "Hm."}
    assert [(c["index"], c["function"]["name"]) for c in deltas[1]["delta"]["tool_calls"]] == [
        (0, "a"),
        (1, "b"),
    ]
    assert "content" not in deltas[1]["delta"]
    assert [(c["index"], c["id"]) for c in deltas[2]["delta"]["tool_calls"]] == [(2, "call_c")]
    assert (deltas[3]["delta"], deltas[3]["finish_reason"]) == ({}, "tool_calls")
    assert not reply.has_unsent_calls
