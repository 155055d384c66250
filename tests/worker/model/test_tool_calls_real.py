"""Tool calls with real weights, through the engine: greedy SmolLM2 and Gemma 3 270M (the base
GGUF, which has no chat template) given tests/data/hermes_tools.jinja follow a conversation's
earlier calls and call the tool for a new city; the engine parses the call out of the text and
ends the request with TOOL_CALLS. Without a template, Gemma 3's chat is refused naming
`messages`; SmolLM2's own template never reads `tools`, so tools are refused naming `tools`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import ChatMessage, Conversation, Tool
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall
from intentserve.worker.model.registry import load_model
from intentserve.worker.sched.sequence import FinishReason

pytestmark = pytest.mark.model

TEMPLATE = (Path(__file__).parents[2] / "data" / "hermes_tools.jinja").read_text()
WEATHER = Tool(
    "get_weather",
    "The current weather in a city",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
)


def _asked(city: str) -> ChatMessage:
    return ChatMessage("user", f"What is the weather in {city}?")


def _called(city: str, call_id: str) -> ChatMessage:
    return ChatMessage(
        "assistant", "", (ToolCall(call_id, "get_weather", json.dumps({"city": city})),)
    )


CONVERSATION = Conversation(
    (
        _asked("Paris"),
        _called("Paris", "call_1"),
        _asked("Rome"),
        _called("Rome", "call_2"),
        _asked("Berlin"),
    ),
    tools=(WEATHER,),
)
# Gemma's own end of turn is not ChatML's: the template's <|im_end|> ends the reply.
GREEDY = SamplingParams(max_tokens=40, temperature=0, stop=("<|im_end|>",))


def _engine(loaded, template: str | None):
    return (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=64 << 20)
        .scheduler(max_model_len=1024, max_num_seqs=4)
        .chat_template(template)
        .build(loaded=loaded)
    )


# Without the template above, what each model's request is refused naming.
REFUSED = {"smollm2-135m": "tools", "gemma3-270m": "messages"}


@pytest.fixture(scope="module", params=sorted(REFUSED))
def model(request):
    return request.param, load_model(request.param, dtype="float32")


def test_the_model_calls_the_tool_and_the_engine_parses_the_call(model):
    (out,) = _engine(model[1], TEMPLATE).generate([CONVERSATION], GREEDY)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Berlin"})
    ], out.new_text
    assert out.finish_reason is FinishReason.TOOL_CALLS
    assert out.new_text.strip() == ""


def test_without_a_template_that_reads_tools_the_request_is_refused_by_name(model):
    name, loaded = model
    with pytest.raises(InvalidRequestError) as info:
        _engine(loaded, None).prepare(CONVERSATION, GREEDY)
    assert info.value.field == REFUSED[name], info.value
    if name == "gemma3-270m":  # the base GGUF has no template at all
        assert "no chat template" in str(info.value)


def test_the_call_and_its_result_sent_back_reach_the_template(model):
    """The parsed call, sent back as the assistant's turn with the tool's result, renders as the
    model wrote it; what the model then does is its own (base Gemma may call again)."""
    engine = _engine(model[1], TEMPLATE)
    (first,) = engine.generate([CONVERSATION], GREEDY)
    (call,) = first.tool_calls
    turns = [
        *(
            {"role": m.role, "content": m.content, "tool_calls": m.tool_calls}
            for m in CONVERSATION.messages
        ),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "9 C and raining", "tool_call_id": call.id},
    ]
    conversation = Conversation.of(turns, [WEATHER])
    prepared = engine.prepare(conversation, GREEDY)
    prompt = engine.tokenizer.decode(prepared.prompt_ids, skip_special_tokens=False)
    assert '{"name": "get_weather", "arguments": {"city": "Berlin"}}' in prompt
    assert prompt.endswith(
        "<tool_response>\n9 C and raining\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    (reply,) = engine.generate([conversation], GREEDY)
    assert reply.new_text.strip() or reply.tool_calls
