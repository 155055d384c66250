"""What a request can cost the worker before it is refused (issue 60): a conversation is refused
from its turns' text before the template renders it, and from the rendered text's bytes before
it is tokenized; too many turns, tool calls or tools are refused by their number; tokenize and
detokenize are bounded the same way; and at most one request renders or tokenizes at a time,
tokenizing at a lower CPU priority than the engine's.

The tiny engine's tokenizer is byte-level BPE whose longest token covers 13 bytes, so at
max_model_len 128 a prompt of more than 13 x 127 = 1651 bytes cannot fit."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import (
    MAX_NUM_MESSAGES,
    MAX_NUM_TOOL_CALLS,
    MAX_NUM_TOOLS,
    ChatMessage,
    Conversation,
    Tool,
)
from intentserve.worker.engine.prepare import TOKENIZER_NICE
from intentserve.worker.engine.sampling import InvalidRequestError, SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall

MAX_MODEL_LEN = 128
MAX_BYTES_PER_TOKEN = 13
PARAMS = SamplingParams(max_tokens=8)
TOOLS_TEMPLATE = (
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
)


@pytest.fixture
def engine(tiny_engine):
    engine = tiny_engine(max_model_len=MAX_MODEL_LEN)
    assert engine.tokenizer.min_num_tokens(b"x" * MAX_BYTES_PER_TOKEN) == 1
    return engine


@pytest.fixture
def calls(engine, monkeypatch) -> dict[str, int]:
    """How many times the engine's tokenizer rendered a conversation and tokenized a text."""
    counts = {"render": 0, "encode": 0}
    tokenizer = engine.tokenizer
    for name, method in (("render", "apply_chat_template"), ("encode", "encode")):
        original = getattr(tokenizer, method)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(tokenizer, method, counted)
    return counts


def prepare(engine, conversation):
    return engine.prepare(conversation, PARAMS)


def tokenize(engine, conversation):
    return engine.tokenize(conversation)


both_paths = pytest.mark.parametrize("path", [prepare, tokenize], ids=["prepare", "tokenize"])


def refusal(call, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        call(*args)
    return info.value


@both_paths
@pytest.mark.parametrize(
    "turns",
    [["é" * 1000], ["é" * 250] * 4],  # 2000 bytes in one turn, or in four: at least 154 tokens
    ids=["one_turn", "four_turns"],
)
def test_a_conversation_too_long_by_its_text_is_refused_before_rendering(
    engine, calls, path, turns
):
    conversation = Conversation(tuple(ChatMessage("user", t) for t in turns))
    error = refusal(path, engine, conversation)
    assert (error.field, calls) == ("messages", {"render": 0, "encode": 0})
    assert "at least 154 tokens" in str(error) and f"at most {MAX_MODEL_LEN - 1}" in str(error)


@both_paths
@pytest.mark.parametrize(
    "turns",
    [["a"] * 100, [" " * 2000 + "hi"]],  # ~2900 rendered bytes; whitespace a template may trim
    ids=["many_short_turns", "padded_turn"],
)
def test_a_rendered_prompt_too_long_by_its_bytes_is_refused_before_tokenizing(
    engine, calls, path, turns
):
    conversation = Conversation(tuple(ChatMessage("user", t) for t in turns))
    error = refusal(path, engine, conversation)
    assert (error.field, calls) == ("messages", {"render": 1, "encode": 0})
    assert "has at least" in str(error)


def test_a_conversation_that_tokenizes_too_long_is_refused_naming_messages(engine, calls):
    conversation = Conversation.user("a " * 200)  # 400 bytes: at least 31 tokens, but 200+
    error = refusal(prepare, engine, conversation)
    assert (error.field, calls) == ("messages", {"render": 1, "encode": 1})
    assert f"tokens; at most {MAX_MODEL_LEN - 1} fit" in str(error)


def test_a_conversation_that_fits_is_rendered_and_tokenized_once(engine, calls):
    conversation = Conversation.user("the cat sat on the mat")
    prepared = prepare(engine, conversation)
    assert calls == {"render": 1, "encode": 1}
    expected = engine.tokenizer.encode(conversation.render(engine.tokenizer))
    assert list(prepared.prompt_ids) == expected == tokenize(engine, conversation)


def _calls(num: int) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(f"call_{i}", "f", "{}") for i in range(num))


@pytest.mark.parametrize(
    ("messages", "tools", "field", "limit"),
    [
        ([ChatMessage("user", "a")] * 100_000, (), "messages", MAX_NUM_MESSAGES),
        ([ChatMessage("user", "a")] * (MAX_NUM_MESSAGES + 1), (), "messages", MAX_NUM_MESSAGES),
        (
            [ChatMessage("user", "a"), ChatMessage("assistant", "", _calls(10_000))],
            (Tool("f"),),
            "messages",
            MAX_NUM_TOOL_CALLS,
        ),
        (
            [ChatMessage("assistant", "", _calls(MAX_NUM_TOOL_CALLS // 2))] * 2
            + [ChatMessage("assistant", "", _calls(1))],
            (Tool("f"),),
            "messages",
            MAX_NUM_TOOL_CALLS,
        ),
        (
            [ChatMessage("user", "a")],
            [Tool(f"f{i}") for i in range(10_000)],
            "tools",
            MAX_NUM_TOOLS,
        ),
        (
            [ChatMessage("user", "a")],
            [Tool(f"f{i}") for i in range(MAX_NUM_TOOLS + 1)],
            "tools",
            MAX_NUM_TOOLS,
        ),
    ],
    ids=[
        "1e5_turns",
        "one_turn_too_many",
        "1e4_tool_calls",
        "one_tool_call_too_many",
        "1e4_tools",
        "one_tool_too_many",
    ],
)
def test_too_many_turns_calls_or_tools_are_refused_by_their_number(messages, tools, field, limit):
    error = refusal(Conversation, tuple(messages), {}, tuple(tools))
    assert error.field == field and f"; at most {limit}" in str(error)


def test_as_many_turns_calls_and_tools_as_allowed_pass_the_count_and_are_measured(tiny_loaded):
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=MAX_MODEL_LEN)
        .chat_template(TOOLS_TEMPLATE)
        .build(loaded=tiny_loaded)
    )
    conversation = Conversation(
        (ChatMessage("user", "a"),) * (MAX_NUM_MESSAGES - 1)
        + (ChatMessage("assistant", "", _calls(MAX_NUM_TOOL_CALLS)),),
        tools=tuple(Tool(f"f{i}") for i in range(MAX_NUM_TOOLS)),
    )
    error = refusal(prepare, engine, conversation)
    assert error.field == "messages" and "has at least" in str(error)  # by its rendered bytes


def test_tokenize_refuses_a_text_that_cannot_fit_without_tokenizing_it(engine, calls):
    error = refusal(engine.tokenize, "é" * 1000)
    assert (error.field, calls["encode"]) == ("prompt", 0)
    assert "at least 154 tokens" in str(error)
    ids = engine.tokenize("a " * 200)  # may fit by its bytes: every id comes back, even past 127
    assert len(ids) > MAX_MODEL_LEN and calls["encode"] == 1


def test_detokenize_refuses_more_ids_than_a_sequence_holds(engine):
    assert engine.detokenize([5] * MAX_MODEL_LEN)
    error = refusal(engine.detokenize, [5] * (MAX_MODEL_LEN + 1))
    assert error.field == "tokens"
    assert f"{MAX_MODEL_LEN + 1} ids; at most {MAX_MODEL_LEN}" in str(error)


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("encode", lambda e: e.tokenize("the cat sat on the mat")),
        ("encode", lambda e: e.prepare("the cat sat on the mat", PARAMS)),
        ("apply_chat_template", lambda e: e.tokenize(Conversation.user("hi"))),
        ("apply_chat_template", lambda e: e.prepare("hi", PARAMS, chat=True)),
    ],
    ids=["tokenize", "prepare", "tokenize_render", "prepare_render"],
)
def test_one_request_at_a_time_renders_or_tokenizes(engine, monkeypatch, method, call):
    tokenizer = engine.tokenizer
    original = getattr(tokenizer, method)
    lock = threading.Lock()
    now, most = [0], [0]

    def slow(*args, **kwargs):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)  # long enough for every other caller to arrive
        with lock:
            now[0] -= 1
        return original(*args, **kwargs)

    monkeypatch.setattr(tokenizer, method, slow)
    threads = [threading.Thread(target=call, args=(engine,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
def test_texts_are_tokenized_at_a_lower_cpu_priority_than_the_callers(engine, monkeypatch):
    encode = engine.tokenizer.encode
    nice: list[int] = []

    def recording(*args, **kwargs):
        nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return encode(*args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", recording)
    engine.tokenize("the cat sat on the mat")
    engine.prepare("the cat sat on the mat", PARAMS)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert nice == [min(own + TOKENIZER_NICE, 19)] * 2
