"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}` through the official `openai` SDK,
the app driven in process (the SDK's HTTP client is Starlette's TestClient) around a fake router
that plays scripted GenerateResponses: the Response object, the event stream as the SDK's own
`responses.stream` parses it, reasoning, function calls and a two-turn tool round trip through
`previous_response_id`, the store (per key, bounded, `store: false`), and errors naming the
parameter."""

from __future__ import annotations

import json

import openai
import pytest
from intentserve.common.field_errors import FieldError
from intentserve.controller.auth import Security
from intentserve.controller.router.http.app import Frontend, build_app
from intentserve.v1 import inference_pb2 as pb
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

MODEL = "smollm2-135m"
KEYS = ("sk-one", "sk-two")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def said(text: str = "", **fields) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, **fields)


def last(reason=pb.FINISH_REASON_STOP, **fields) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        finish_reason=reason, num_prompt_tokens=11, num_output_tokens=4, **fields
    )


HELLO = [said("Hel", num_output_tokens=1), said("lo!", num_output_tokens=3), last()]
CALL = pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


class Router:
    """Plays `script` (a GenerateResponse, or an exception raised there) for every call."""

    def __init__(self) -> None:
        self.script: list = HELLO
        self.requests: list[pb.GenerateRequest] = []

    async def agenerate(self, request, call):
        self.requests.append(request)
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item


def serve(keys: tuple[str, ...] = KEYS, store_size: int = 8):
    router = Router()
    security = Security(api_keys=frozenset(keys))
    frontend = Frontend(
        router, None, security, (MODEL,), CollectorRegistry(), None, responses_store_size=store_size
    )
    return router, TestClient(build_app(frontend), raise_server_exceptions=False)


def client_of(http: TestClient, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=key, base_url="http://testserver/v1", http_client=http, max_retries=0
    )


@pytest.fixture
def served():
    router, http = serve()
    with http:
        yield client_of(http), http, router


def stored(http: TestClient) -> float:
    """What /metrics says the store holds."""
    families = text_string_to_metric_families(http.get("/metrics").text)
    (family,) = (f for f in families if f.name == "intentserve_http_responses_stored")
    return family.samples[0].value


def turns(request: pb.GenerateRequest) -> list[tuple]:
    return [
        (m.role, m.content, [(c.id, c.name, c.arguments) for c in m.tool_calls], m.tool_call_id)
        for m in request.messages
    ]


def test_create_gives_a_response_and_sends_the_conversation(served):
    client, _, router = served
    done = client.responses.create(
        model=MODEL,
        input="Hi",
        instructions="Be brief.",
        max_output_tokens=16,
        temperature=0.0,
        metadata={"trace": "t1"},
    )
    assert done.object == "response" and done.id.startswith("resp_") and done.model == MODEL
    assert (done.status, done.incomplete_details, done.error) == ("completed", None, None)
    assert done.output_text == "Hello!"
    (message,) = done.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert [(p.type, p.text) for p in message.content] == [("output_text", "Hello!")]
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (
        11,
        4,
        15,
    )
    assert done.instructions == "Be brief." and done.metadata == {"trace": "t1"}
    sent = router.requests[-1]
    assert turns(sent) == [("system", "Be brief.", [], ""), ("user", "Hi", [], "")]
    assert sent.stop.max_tokens == 16 and sent.sampling.temperature == 0.0


def test_a_reply_cut_by_max_output_tokens_is_incomplete(served):
    client, _, router = served
    router.script = [said("Hel"), last(pb.FINISH_REASON_LENGTH)]
    done = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    assert done.status == "incomplete"
    assert done.incomplete_details.reason == "max_output_tokens"
    assert done.output[0].status == "incomplete" and done.output_text == "Hel"


def test_the_stream_is_the_documented_events_as_the_sdk_parses_them(served):
    client, _, _ = served
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["Hel", "lo!"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final.output_text == "Hello!" and final.usage.output_tokens == 4
    assert final.id == events[0].response.id and final.status == "completed"


def test_create_with_stream_true_gives_the_same_events(served):
    client, _, _ = served
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hello!"


def test_a_streamed_reply_cut_by_max_output_tokens_ends_with_response_incomplete(served):
    client, _, router = served
    router.script = [said("Hel"), last(pb.FINISH_REASON_LENGTH)]
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_reasoning_is_an_item_of_its_own_before_the_message(served):
    client, _, router = served
    router.script = [
        said(reasoning="The user greets. "),
        said(reasoning="Greet back."),
        said("Hello!"),
        last(),
    ]
    done = client.responses.create(model=MODEL, input="Hi")
    thought, message = done.output
    assert thought.type == "reasoning" and thought.id.startswith("rs_")
    assert [(c.type, c.text) for c in thought.content] == [
        ("reasoning_text", "The user greets. Greet back.")
    ]
    assert thought.summary == [] and done.output_text == "Hello!"
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    assert [i.type for i in final.output] == ["reasoning", "message"]
    # The next turn gets the reply, not the reasoning.
    client.responses.create(model=MODEL, input="Again", previous_response_id=done.id)
    assert turns(router.requests[-1])[1] == ("assistant", "Hello!", [], "")


def test_a_function_call_is_an_item_streamed_with_its_arguments(served):
    client, _, router = served
    router.script = [said(tool_calls=[CALL]), last(pb.FINISH_REASON_TOOL_CALLS)]
    done = client.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice="required"
    )
    (call,) = done.output
    assert (call.type, call.call_id, call.name, call.status) == (
        "function_call",
        "call_1",
        "get_weather",
        "completed",
    )
    assert json.loads(call.arguments) == {"city": "Paris"} and call.id.startswith("fc_")
    assert done.status == "completed" and done.tools[0].name == "get_weather"
    sent = router.requests[-1]
    assert [t.name for t in sent.tools] == ["get_weather"]
    assert sent.tool_choice == pb.TOOL_CHOICE_REQUIRED
    with client.responses.stream(model=MODEL, input="Weather?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events][2:6] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert final.output[0].arguments == CALL.arguments


def test_a_two_turn_tool_call_through_previous_response_id(served):
    client, _, router = served
    router.script = [said(tool_calls=[CALL]), last(pb.FINISH_REASON_TOOL_CALLS)]
    first = client.responses.create(
        model=MODEL, input="Weather in Paris?", instructions="Use tools.", tools=[WEATHER]
    )
    call = first.output[0]
    router.script = HELLO
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "9 C, rain"}],
        tools=[WEATHER],
    )
    assert second.previous_response_id == first.id and second.output_text == "Hello!"
    # The instructions are the request's own: the stored conversation has none.
    assert turns(router.requests[-1]) == [
        ("user", "Weather in Paris?", [], ""),
        ("assistant", "", [("call_1", "get_weather", CALL.arguments)], ""),
        ("tool", "9 C, rain", [], "call_1"),
    ]
    client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks")
    assert turns(router.requests[-1])[-2:] == [
        ("assistant", "Hello!", [], ""),
        ("user", "Thanks", [], ""),
    ]


def test_the_output_sent_back_as_input_is_the_same_conversation(served):
    """The stateless way: `store: false`, and the earlier output passed back in `input`."""
    client, _, router = served
    router.script = [said(tool_calls=[CALL]), last(pb.FINISH_REASON_TOOL_CALLS)]
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.responses.create(model=MODEL, input=asked, tools=[WEATHER], store=False)
    output = [item.model_dump(exclude_none=True) for item in first.output]
    result = {"type": "function_call_output", "call_id": "call_1", "output": "9 C"}
    client.responses.create(model=MODEL, input=[*asked, *output, result], tools=[WEATHER])
    assert turns(router.requests[-1])[1:] == [
        ("assistant", "", [("call_1", "get_weather", CALL.arguments)], ""),
        ("tool", "9 C", [], "call_1"),
    ]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_get_and_delete_a_stored_response(served):
    client, http, _ = served
    done = client.responses.create(model=MODEL, input="Hi")
    again = client.responses.retrieve(done.id)
    assert again.model_dump() == done.model_dump()
    assert client.responses.delete(done.id) is None
    raw = http.delete(f"/v1/responses/{done.id}", headers={"authorization": f"Bearer {KEYS[0]}"})
    assert raw.status_code == 404 and raw.json()["error"]["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.retrieve(done.id)
    assert error.value.body["param"] == "response_id" and done.id in error.value.body["message"]


def test_delete_answers_openais_deleted_object(served):
    client, http, _ = served
    done = client.responses.create(model=MODEL, input="Hi")
    raw = http.delete(f"/v1/responses/{done.id}", headers={"authorization": f"Bearer {KEYS[0]}"})
    assert raw.json() == {"id": done.id, "object": "response.deleted", "deleted": True}


def test_a_streamed_response_is_stored_once_completed(served):
    client, _, _ = served
    with client.responses.stream(model=MODEL, input="Hi") as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == "Hello!"


def test_a_keys_responses_are_invisible_to_another_key(served):
    client, http, router = served
    done = client.responses.create(model=MODEL, input="Hi")
    other = client_of(http, KEYS[1])
    with pytest.raises(openai.NotFoundError) as error:
        other.responses.retrieve(done.id)
    assert error.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as error:
        other.responses.create(model=MODEL, input="Hi", previous_response_id=done.id)
    assert error.value.body["param"] == "previous_response_id"
    assert done.id in error.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(done.id)
    assert client.responses.retrieve(done.id).id == done.id  # still the first key's
    assert len(router.requests) == 1  # the refused continuation reached no worker


def test_without_keys_every_client_shares_one_store():
    _, http = serve(keys=())
    with http:
        done = client_of(http, "anything").responses.create(model=MODEL, input="Hi")
        assert client_of(http, "something else").responses.retrieve(done.id).id == done.id


def test_the_store_keeps_each_keys_last_responses_up_to_its_size():
    _, http = serve(store_size=2)
    with http:
        client, other = client_of(http), client_of(http, KEYS[1])
        first, second = (client.responses.create(model=MODEL, input="Hi") for _ in range(2))
        client.responses.retrieve(first.id)  # now the most recently used
        theirs = other.responses.create(model=MODEL, input="Hi")  # another key's: no effect
        third = client.responses.create(model=MODEL, input="Hi")
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(second.id)  # the least recently used went
        for kept in (first, third):
            assert client.responses.retrieve(kept.id).id == kept.id
        assert other.responses.retrieve(theirs.id).id == theirs.id
        assert stored(http) == 3  # two of the first key's, one of the other's
        client.responses.delete(first.id)
        assert stored(http) == 2


def test_an_unknown_previous_response_id_is_404_naming_it(served):
    client, _, router = served
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_nope")
    assert error.value.body["param"] == "previous_response_id"
    assert "resp_nope" in error.value.body["message"] and router.requests == []


def test_refusals_name_the_field(served):
    client, http, router = served
    cases = [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web search"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type", "file"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "computer use"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type", "code interpreter"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "leave it out"),
        ({"background": True}, "background", "allowed: false"),
        ({"truncation": "auto"}, "truncation", "allowed: 'disabled'"),
        ({"input": [{"type": "computer_call_output"}]}, "input[0].type", "computer use"),
    ]
    for fields, param, said_ in cases:
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(**{"model": MODEL, "input": "Hi", **fields})
        body = error.value.body
        assert body["param"] == param and body["message"].startswith(f"{param}: "), body
        assert said_ in body["message"] and body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.create(model="gpt-5", input="Hi")
    assert error.value.body["param"] == "model"
    raw = http.get("/v1/responses/resp_x?stream=true", headers={"authorization": "Bearer sk-one"})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "stream"
    with pytest.raises(openai.AuthenticationError):
        client_of(http, "sk-wrong").responses.retrieve("resp_x")
    assert router.requests == []


def test_the_workers_refusal_names_the_bodys_parameter(served):
    client, _, router = served
    for field, param in [
        ("stop.max_tokens", "max_output_tokens"),
        ("sampling.temperature", "temperature"),
        ("sampling.constraint.json_schema", "text.format"),
        ("messages[1].content", "input"),
        ("tools[0].parameters", "tools[1].parameters"),
        ("tool_choice_function", "tool_choice"),
    ]:
        router.script = [FieldError(field, "is wrong")]
        choice = {
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "function", "name": "get_time"}],
        }
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(
                model=MODEL,
                input="Hi",
                tools=[WEATHER, {**WEATHER, "name": "get_time"}],
                tool_choice=choice,
            )
        assert error.value.body["param"] == param
        assert error.value.body["message"] == f"{param}: is wrong"


def test_a_failure_mid_stream_is_an_error_event_then_response_failed(served):
    client, http, router = served
    router.script = [said("Hel"), FieldError("stop.max_tokens", "too many")]
    raw = http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "Hi", "stream": True},
        headers={"authorization": f"Bearer {KEYS[0]}"},
    )
    assert raw.status_code == 200
    events = [json.loads(e.split("data: ", 1)[1]) for e in raw.text.split("\n\n") if e]
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["param"] == "max_output_tokens"
    assert events[-2]["message"] == "max_output_tokens: too many"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "too many" in failed["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(failed["id"])  # a failed response is not kept
