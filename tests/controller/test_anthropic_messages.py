"""`POST /v1/messages` and `/v1/messages/count_tokens` through the official `anthropic` SDK, the
app driven in process (the SDK's HTTP client is Starlette's TestClient) around a fake router that
plays scripted GenerateResponses: the Message object, the event stream as the SDK's own
`messages.stream` parses it, thinking blocks, tool_use and a tool round trip, the headers, and
errors in Anthropic's shape naming the field's path."""

from __future__ import annotations

import hashlib
import json

import anthropic
import pytest
from intentserve.common.field_errors import FieldError
from intentserve.controller.auth import Security
from intentserve.controller.router.http.app import Frontend, build_app
from intentserve.v1 import inference_pb2 as pb
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

MODEL = "smollm2-135m"
KEY = "sk-test"
HI = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
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


class Tokenizing:
    def __init__(self) -> None:
        self.requests: list[pb.TokenizeRequest] = []

    async def tokenize(self, request, timeout_s):
        self.requests.append(request)
        words = sum(len(m.content.split()) for m in request.messages) + len(request.tools)
        return pb.TokenizeResponse(tokens=list(range(words)), max_model_len=1024)


@pytest.fixture
def served():
    router, tokenizing = Router(), Tokenizing()
    security = Security(api_keys=frozenset({KEY}))
    frontend = Frontend(router, None, security, (MODEL,), CollectorRegistry(), tokenizing)
    with TestClient(build_app(frontend), raise_server_exceptions=False) as http:
        client = anthropic.Anthropic(
            api_key=KEY, base_url="http://testserver", http_client=http, max_retries=0
        )
        yield client, http, router, tokenizing


def create(client, **kwargs):
    return client.messages.create(**{"model": MODEL, "max_tokens": 16, "messages": HI, **kwargs})


def test_create_gives_a_message_and_sends_the_conversation(served):
    client, _, router, _ = served
    done = create(
        client, system="Be brief.", stop_sequences=["\n\n"], extra_body={"temperature": 0.0}
    )
    assert done.type == "message" and done.role == "assistant" and done.model == MODEL
    assert done.id.startswith("msg_")
    assert [(b.type, b.text) for b in done.content] == [("text", "Hello!")]
    assert (done.stop_reason, done.stop_sequence) == ("end_turn", None)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (11, 4)
    sent = router.requests[-1]
    assert [(m.role, m.content) for m in sent.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert list(sent.stop.stop) == ["\n\n"] and sent.stop.max_tokens == 16
    assert sent.sampling.temperature == 0.0


def test_a_reply_cut_by_max_tokens_says_so(served):
    client, _, router, _ = served
    router.script = [said("Hel"), last(pb.FINISH_REASON_LENGTH)]
    assert create(client).stop_reason == "max_tokens"


def test_a_stop_sequence_that_ended_the_reply_is_named(served):
    client, _, router, _ = served
    router.script = [said("Hel"), last(stop_string="lo")]
    done = create(client, stop_sequences=["x", "lo"])
    assert (done.stop_reason, done.stop_sequence) == ("stop_sequence", "lo")
    with client.messages.stream(
        model=MODEL, max_tokens=16, messages=HI, stop_sequences=["x", "lo"]
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "lo")


def test_the_stream_is_anthropics_events_as_the_sdk_parses_them(served):
    client, http, _, _ = served
    with client.messages.stream(model=MODEL, max_tokens=16, messages=HI) as stream:
        kinds = [event.type for event in stream if event.type != "text"]
        final = stream.get_final_message()
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert [(b.type, b.text) for b in final.content] == [("text", "Hello!")]
    assert final.stop_reason == "end_turn" and final.usage.input_tokens == 11
    assert final.usage.output_tokens == 4
    raw = http.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 16, "messages": HI, "stream": True},
        headers={"x-api-key": KEY},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    lines = raw.text.split("\n")
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data]  # each event's `event:` line names its type


def test_thinking_comes_as_thinking_blocks_with_their_signature(served):
    client, _, router, _ = served
    router.script = [
        pb.GenerateResponse(reasoning="Let me "),
        pb.GenerateResponse(reasoning="think.", text="Hi"),
        said(" there"),
        last(),
    ]
    done = create(client)
    signature = hashlib.sha256(b"Let me think.").hexdigest()
    assert [b.type for b in done.content] == ["thinking", "text"]
    assert (done.content[0].thinking, done.content[0].signature) == ("Let me think.", signature)
    assert done.content[1].text == "Hi there"
    with client.messages.stream(model=MODEL, max_tokens=16, messages=HI) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert deltas == [
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "text_delta",
    ]
    assert final.content[0].signature == signature and final.content[0].thinking == "Let me think."
    hidden = create(client, thinking={"type": "adaptive", "display": "omitted"})
    assert (hidden.content[0].thinking, hidden.content[0].signature) == ("", signature)


def test_thinking_when_it_is_disabled_is_an_error_naming_thinking(served):
    client, _, router, _ = served
    router.script = [pb.GenerateResponse(reasoning="Hmm"), last()]
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client, thinking={"type": "disabled"})
    assert error.value.body["error"]["message"].startswith("thinking: the model thought")
    assert dict(router.requests[-1].chat_template_kwargs) == {"enable_thinking": False}
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client, thinking={"type": "enabled", "budget_tokens": 2048})
    assert error.value.body["error"]["message"].startswith("thinking.budget_tokens: ")


def test_a_tool_call_is_a_tool_use_block_and_its_result_goes_back(served):
    client, _, router, _ = served
    router.script = [said(tool_calls=[CALL]), last(pb.FINISH_REASON_TOOL_CALLS)]
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    done = create(client, messages=asked, tools=[WEATHER], tool_choice={"type": "any"})
    assert done.stop_reason == "tool_use"
    (use,) = done.content
    assert (use.type, use.id, use.name, use.input) == (
        "tool_use",
        "call_1",
        "get_weather",
        {"city": "Paris"},
    )
    assert router.requests[-1].tool_choice == pb.TOOL_CHOICE_REQUIRED
    with client.messages.stream(
        model=MODEL, max_tokens=16, messages=asked, tools=[WEATHER]
    ) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert json.loads("".join(partial)) == {"city": "Paris"}
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"
    router.script = HELLO
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "9 C, rain"}
    turns = [
        *asked,
        {"role": "assistant", "content": done.content},
        {"role": "user", "content": [result]},
    ]
    assert create(client, messages=turns, tools=[WEATHER]).content[0].text == "Hello!"
    sent = router.requests[-1]
    assert [(m.role, m.tool_call_id) for m in sent.messages] == [
        ("user", ""),
        ("assistant", ""),
        ("tool", "call_1"),
    ]
    (sent_call,) = sent.messages[1].tool_calls
    assert (sent_call.id, sent_call.name, json.loads(sent_call.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Paris"},
    )
    assert sent.messages[2].content == "9 C, rain"


def test_count_tokens_counts_the_conversations_prompt(served):
    client, _, _, tokenizing = served
    counted = client.messages.count_tokens(
        model=MODEL, system="Be brief.", messages=[{"role": "user", "content": "One two three"}]
    )
    assert counted.input_tokens == 5
    sent = tokenizing.requests[-1]
    assert [(m.role, m.content) for m in sent.messages] == [
        ("system", "Be brief."),
        ("user", "One two three"),
    ]


def _error(response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


def test_the_key_is_x_api_key_or_bearer(served):
    _, http, _, _ = served
    body = {"model": MODEL, "max_tokens": 16, "messages": HI}
    assert http.post("/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
    bearer = {"authorization": f"Bearer {KEY}"}
    assert http.post("/v1/messages", json=body, headers=bearer).status_code == 200
    wrong = http.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": "nope"})
    assert "API key" in _error(wrong, 401, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            api_key="nope", base_url="http://testserver", http_client=http, max_retries=0
        ).messages.create(model=MODEL, max_tokens=16, messages=HI)


@pytest.mark.parametrize(
    ("headers", "starts"),
    [
        ({"anthropic-version": "2099-01-01"}, "anthropic-version: '2099-01-01' is not a version"),
        (
            {"anthropic-beta": "computer-use-2025-01-24"},
            "anthropic-beta: 'computer-use-2025-01-24'",
        ),
        (
            {"anthropic-beta": "prompt-caching-2024-07-31, mcp-client-2025-04-04"},
            "anthropic-beta: 'mcp-client-2025-04-04'",
        ),
        (  # Claude Code's own: a server-side mode, not a field judged by itself
            {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
            "anthropic-beta: 'claude-code-20250219'",
        ),
    ],
)
def test_an_unknown_version_or_beta_is_refused_naming_the_header(served, headers, starts):
    _, http, _, _ = served
    body = {"model": MODEL, "max_tokens": 16, "messages": HI}
    refused = http.post("/v1/messages", json=body, headers={"x-api-key": KEY, **headers})
    assert _error(refused, 400, "invalid_request_error").startswith(starts)


def test_the_versions_the_sdk_sends_and_a_served_beta_pass(served):
    _, http, _, _ = served
    body = {"model": MODEL, "max_tokens": 16, "messages": HI}
    for headers in (
        {"anthropic-version": "2023-06-01"},
        {"anthropic-version": anthropic._constants.ANTHROPIC_API_VERSION},
        {"anthropic-beta": "token-counting-2024-11-01"},
        # What Claude Code sends with CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS, but its own.
        {
            "anthropic-beta": "interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07,"
            "effort-2025-11-24,structured-outputs-2025-12-15"
        },
        {},
    ):
        sent = http.post("/v1/messages", json=body, headers={"x-api-key": KEY, **headers})
        assert sent.status_code == 200, (headers, sent.text)


def test_errors_are_anthropics_shape_naming_the_path(served):
    client, _, router, _ = served
    with pytest.raises(anthropic.NotFoundError) as error:
        create(client, model="claude-opus-4")
    assert error.value.body["error"]["type"] == "not_found_error"
    assert "model 'claude-opus-4' is not served here" in error.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as error:
        create(
            client,
            messages=[
                *HI,
                {"role": "assistant", "content": "Hm"},
                {"role": "user", "content": [image]},
            ],
        )
    assert error.value.body["error"]["message"].startswith("messages[2].content[0].type: image")
    router.script = [FieldError("messages[1].content", "the template could not render it")]
    with pytest.raises(anthropic.BadRequestError) as error:
        create(
            client,
            system="S",
            messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}],
        )
    message = error.value.body["error"]["message"]
    assert message == "messages[0]: the template could not render it"
    router.script = [FieldError("stop.max_tokens", "900 does not fit")]
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client)
    assert error.value.body["error"]["message"] == "max_tokens: 900 does not fit"


def test_a_failure_mid_stream_is_an_error_event(served):
    client, http, router, _ = served
    router.script = [said("Hel"), FieldError("stop.stop", "too many")]
    raw = http.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 16, "messages": HI, "stream": True},
        headers={"x-api-key": KEY},
    )
    assert raw.status_code == 200
    assert raw.text.split("\n\n")[-2].startswith("event: error\ndata: ")
    error = json.loads(raw.text.split("\n\n")[-2].split("data: ", 1)[1])
    assert error == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "stop_sequences: too many"},
    }
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(model=MODEL, max_tokens=16, messages=HI) as stream,
    ):
        list(stream)
