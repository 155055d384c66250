"""Gemma 3 tool calls end to end: `intentserve serve gemma3-270m --chat-template
tests/data/hermes_tools.jinja` (the 270M GGUF has no chat template of its own, so a chat needs
one, and this one reads `tools`), then the official `openai` client with tool_choice required:
the grammar holds the reply to one call, the worker parses it, and the client gets it as
`tool_calls` with `finish_reason: "tool_calls"`.

One CPU worker with small limits and few tokens, so it is quick.
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
        importlib.util.find_spec(SHORT_NAMES["gemma3-270m"].module) is None,
        reason="the Gemma 3 270M GGUF packages are not installed",
    ),
]

MODEL = "gemma3-270m"
TEMPLATE = "tests/data/hermes_tools.jinja"
# 64Mi: one 1024-token sequence in float32 (what `dtype: auto` gives without avx512_bf16), 36 MiB.
FLAGS = ("--kv-cache-memory", "64Mi", "--max-model-len", "1024", "--max-num-seqs", "2")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    process = UpProcess(
        MODEL,
        tmp_path_factory.mktemp("serve-gemma-tools"),
        command=("serve",),
        extra_args=(*FLAGS, "--chat-template", TEMPLATE),
    )
    try:
        process.wait_ready(timeout_s=600)
        key = re.search(r"API key \(made for this run\): (\S+)", process.stdout).group(1)
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{process.http_port}/v1",
            api_key=key,
            max_retries=0,
            timeout=300,
        ) as client:
            yield client
    finally:
        process.stop()


def test_a_required_call_comes_back_parsed_as_tool_calls(client):
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Berlin?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=48,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments.keys() == {"city"} and isinstance(arguments["city"], str)
