"""A thinking model's reasoning through each front door, with the router scripted: chat
completions' `reasoning_content` (whole and streamed), and each door's thinking budget
(`reasoning_effort`, `reasoning.effort`, `thinking.budget_tokens`) reaching the worker, whose
refusal on a model that does not think names the door's own field."""

from __future__ import annotations

import anthropic
import openai
import pytest
from intentserve.common.field_errors import FieldError
from intentserve.controller.auth import Security
from intentserve.controller.router.http.app import Frontend, build_app
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from tests.controller import test_anthropic_messages as messages_door
from tests.controller.test_responses_api import MODEL, client_of, last, said, serve

THOUGHT = [
    said(reasoning="The user greets. ", num_reasoning_tokens=2),
    said(reasoning="Greet back.", num_reasoning_tokens=3),
    said("Hello!"),
    last(num_reasoning_tokens=3),
]
NOT_THINKING = FieldError("reasoning_budget", "this model does not think; leave it out")


@pytest.fixture
def chat():
    router, http = serve()
    with http:
        yield client_of(http), router


def ask(client, **kwargs):
    messages = [{"role": "user", "content": "Hi"}]
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs)


def test_a_chat_reply_carries_its_reasoning_apart_from_its_content(chat):
    client, router = chat
    router.script = THOUGHT
    completion = ask(client)
    message = completion.choices[0].message
    assert message.content == "Hello!"
    assert message.model_extra["reasoning_content"] == "The user greets. Greet back."
    assert completion.usage.completion_tokens_details.reasoning_tokens == 3


def test_a_reply_without_thinking_has_no_reasoning_content(chat):
    client, _ = chat  # the default script: text only
    completion = ask(client)
    assert "reasoning_content" not in completion.choices[0].message.model_extra
    assert completion.usage.completion_tokens_details is None


def test_a_streamed_chat_sends_reasoning_deltas_then_content(chat):
    client, router = chat
    router.script = THOUGHT
    deltas = [c.choices[0].delta for c in ask(client, stream=True) if c.choices]
    pairs = [(d.model_extra.get("reasoning_content"), d.content) for d in deltas]
    pairs = [p for p in pairs if p != (None, None)]
    assert pairs == [
        (None, ""),  # the first chunk says who speaks
        ("The user greets. ", None),
        ("Greet back.", None),
        (None, "Hello!"),
    ]


@pytest.mark.parametrize(("effort", "budget"), [("none", 0), ("low", 1024), ("high", 16384)])
def test_reasoning_effort_is_the_workers_thinking_budget(chat, effort, budget):
    client, router = chat
    ask(client, reasoning_effort=effort)
    assert router.requests[-1].reasoning_budget == budget


def test_no_effort_asks_for_no_budget(chat):
    client, router = chat
    ask(client)
    assert not router.requests[-1].HasField("reasoning_budget")


def test_a_model_that_does_not_think_refuses_reasoning_effort_by_name(chat):
    client, router = chat
    router.script = [NOT_THINKING]
    with pytest.raises(openai.BadRequestError) as error:
        ask(client, reasoning_effort="low")
    assert error.value.body["param"] == "reasoning_effort"
    assert "does not think" in error.value.body["message"]


def test_the_responses_api_counts_the_thinking_tokens(chat):
    client, router = chat
    router.script = THOUGHT
    response = client.responses.create(model=MODEL, input="Hi")
    assert response.usage.output_tokens_details.reasoning_tokens == 3
    assert [item.type for item in response.output] == ["reasoning", "message"]


def test_the_responses_api_refuses_it_naming_reasoning_effort(chat):
    client, router = chat
    router.script = [NOT_THINKING]
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, input="Hi", reasoning={"effort": "low"})
    assert error.value.body["param"] == "reasoning.effort"
    assert router.requests[-1].reasoning_budget == 1024


@pytest.fixture
def messages():
    """The Messages door over a scripted router (test_anthropic_messages' parts)."""
    router = messages_door.Router()
    security = Security(api_keys=frozenset({messages_door.KEY}))
    frontend = Frontend(
        router, None, security, (MODEL,), CollectorRegistry(), messages_door.Tokenizing()
    )
    with TestClient(build_app(frontend), raise_server_exceptions=False) as http:
        client = anthropic.Anthropic(
            api_key=messages_door.KEY, base_url="http://testserver", http_client=http, max_retries=0
        )
        yield client, router


def test_a_thinking_budget_reaches_the_worker_and_is_refused_by_its_name(messages):
    client, router = messages
    thinking = {"type": "enabled", "budget_tokens": 8}
    router.script = THOUGHT
    reply = messages_door.create(client, thinking=thinking)
    assert router.requests[-1].reasoning_budget == 8
    assert [(b.type, getattr(b, "thinking", None)) for b in reply.content][0] == (
        "thinking",
        "The user greets. Greet back.",
    )
    router.script = [NOT_THINKING]
    with pytest.raises(anthropic.BadRequestError) as error:
        messages_door.create(client, thinking=thinking)
    assert error.value.body["error"]["message"].startswith("thinking.budget_tokens: ")
