"""A thinking model end to end, as a user meets it: `intentserve up` of a model whose chat template
opens the thinking and whose vocabulary has its markers (a tiny random-weight Llama made here;
Qwen3 has the same shape), then the official SDKs: chat completions' `reasoning_content` and
`reasoning_effort`, the Responses API's reasoning item and `reasoning.effort`, the Messages API's
thinking block and `thinking.budget_tokens`. The budget ends the thinking after that many tokens
(the worker writes the end marker), and the reply follows. The worker's realized reasoning is in
`status`, `explain` and /metrics. A model that does not think refuses each budget by its door's
name (test_reasoning_doors, with the router scripted; the worker's refusal in
test_reasoning_engine)."""

from __future__ import annotations

import anthropic
import httpx2 as httpx
import pytest
from intentserve.client.sync import ControllerClient

from tests.launcher.up_process import UpProcess
from tests.worker.model.tiny_checkpoints import write_thinking_folder

pytestmark = [pytest.mark.integration]
API_KEY = "sk-reasoning-e2e"
MANIFEST = """\
apiVersion: intentserve/v1
kind: Deployment
metadata: {{name: thinking}}
spec:
  model: {{name: {model}, dtype: float32}}
  replicas: 1
  resources: {{device: cpu, numCpus: 1}}
  pagedAttention: {{mode: "on", kvCacheMemory: 8Mi}}
  scheduler: {{maxNumSeqs: 4, maxModelLen: 128}}
  security: {{apiKeysFile: {keys}}}
"""
HI = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    folder = tmp_path_factory.mktemp("up-thinking")
    (folder / "keys").write_text(f"{API_KEY}\n")
    model = write_thinking_folder(folder / "model")
    (folder / "manifest.yaml").write_text(MANIFEST.format(model=model, keys=folder / "keys"))
    process = UpProcess(str(folder / "manifest.yaml"), folder)
    try:
        process.wait_ready(timeout_s=150)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(up):
    with up.openai_client(API_KEY) as client:
        yield client


def chat(client, **kwargs):
    return client.chat.completions.create(model=model_of(client), messages=HI, **kwargs)


def model_of(client) -> str:
    return client.models.list().data[0].id


def test_a_budget_ends_the_thinking_and_the_reply_follows(client):
    free = chat(client, max_tokens=10, **GREEDY)
    budgeted = chat(client, max_tokens=10, reasoning_effort="none", **GREEDY)
    # This random model never ends its thinking: without a budget all of it is reasoning.
    assert free.choices[0].message.content == ""
    assert free.choices[0].message.model_extra["reasoning_content"]
    assert free.usage.completion_tokens == budgeted.usage.completion_tokens == 10
    assert free.usage.completion_tokens_details.reasoning_tokens == 10
    # `none` ends it at once: the end marker, then 9 tokens of reply and no reasoning at all.
    assert budgeted.choices[0].message.content
    assert "reasoning_content" not in budgeted.choices[0].message.model_extra


def test_a_streamed_reply_sends_reasoning_then_content(client):
    stream = client.chat.completions.create(
        model=model_of(client),
        messages=HI,
        max_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True, "min_tokens": 12},
        temperature=0,
    )
    kinds = []
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            for kind in ("reasoning_content", "content"):
                value = delta.model_extra.get(kind) if kind != "content" else delta.content
                if value and "think>" not in value:
                    kinds.append(kind)
    assert kinds and set(kinds) == {"reasoning_content"}  # never closed: reasoning only


def test_the_responses_api_gives_a_reasoning_item_then_the_message(client):
    response = client.responses.create(
        model=model_of(client),
        input="Hello",
        max_output_tokens=10,
        temperature=0,
        reasoning={"effort": "none"},
    )
    assert response.reasoning.effort == "none"
    assert [item.type for item in response.output] == ["message"]  # no thinking at all
    thought = client.responses.create(
        model=model_of(client), input="Hello", max_output_tokens=10, temperature=0
    )
    assert thought.output[0].type == "reasoning"
    assert thought.output[0].content[0].text


def test_the_messages_api_gives_a_thinking_block_of_its_budget(up):
    client = anthropic.Anthropic(
        base_url=f"https://127.0.0.1:{up.http_port}",
        api_key=API_KEY,
        http_client=httpx.Client(verify=up.tls()),
        max_retries=0,
    )
    model = "thinking"
    with httpx.Client(verify=up.tls()) as http:
        served = http.get(
            f"https://127.0.0.1:{up.http_port}/v1/models",
            headers={"authorization": f"Bearer {API_KEY}"},
        ).json()
        model = served["data"][0]["id"]
    reply = client.messages.create(
        model=model,
        max_tokens=10,
        messages=HI,
        thinking={"type": "enabled", "budget_tokens": 3},
        extra_body={"temperature": 0},
    )
    kinds = [block.type for block in reply.content]
    assert kinds[0] == "thinking" and reply.content[0].thinking
    assert reply.usage.output_tokens == 10


def test_status_explain_and_metrics_show_the_reasoning(up):
    with ControllerClient(up.address, timeout_s=60) as admin:
        status = admin.status()
        worker = status["workers"][0]
        explained = admin.explain(worker["worker_id"])
    assert worker["realized"]["reasoning"] == {
        "start": "<think>",
        "end": "</think>",
        "opened_by_template": True,
    }
    assert "reasoning between <think> and </think>, opened by the template" in str(explained)
    with httpx.Client(verify=up.tls()) as http:
        text = http.get(f"https://127.0.0.1:{up.http_port}/metrics").text
    info = [
        line for line in text.splitlines() if line.startswith("intentserve_worker_realized_info")
    ]
    assert info and all('reasoning="true"' in line for line in info)
