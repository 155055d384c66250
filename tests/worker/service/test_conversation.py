"""A whole conversation (`GenerateRequest.messages`) through the worker's conversion and the
engine's checks, and `max_tokens` left unset; no model, no server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from intentserve.v1 import inference_pb2, worker_pb2
from intentserve.worker.engine.chat import ChatMessage, Conversation, Tool
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.request import PreparedRequest
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.engine.tool_calls import ToolCall
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoad

MAX_MODEL_LEN = 256


class TurnsTokenizer:
    """One token per character; a chat template that renders every turn."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 100 for c in text]

    def min_num_tokens(self, utf8: bytes) -> int:
        return 0  # no cheap bound: every prompt is tokenized to be measured

    def apply_chat_template(self, messages):
        if any(m["content"] == "refused" for m in messages):
            raise ValueError("chat template rejected the messages: refused")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def engine() -> Engine:
    runner = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=100)))
    tokenizer = TurnsTokenizer()
    return Engine(
        tokenizer=tokenizer,
        scheduler=None,
        runner=runner,
        realized=None,
        grammars=GrammarCompiler(tokenizer),
        max_model_len=MAX_MODEL_LEN,
    )


def decode(**fields) -> PreparedRequest:
    fields.setdefault("stop", inference_pb2.StopConditions(max_tokens=4))
    call = convert.generate_request_from_pb(inference_pb2.GenerateRequest(**fields))
    with convert.proto_field_names():
        return engine().prepare(call.prompt, call.params, call.request_id, chat=call.chat)


def turns(*pairs: tuple[str, str]) -> list[inference_pb2.ChatMessage]:
    return [inference_pb2.ChatMessage(role=r, content=c) for r, c in pairs]


def test_every_turn_goes_through_the_template():
    messages = turns(
        ("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "2+2?")
    )
    prepared = decode(messages=messages)
    text = "<system>Be brief.<user>Hi<assistant>Hello!<user>2+2?<assistant>"
    assert prepared.prompt_ids == tuple(TurnsTokenizer().encode(text))


def test_chat_still_renders_the_prompt_as_one_user_turn():
    assert decode(prompt="Hi", chat=True).prompt_ids == tuple(
        TurnsTokenizer().encode("<user>Hi<assistant>")
    )


@pytest.mark.parametrize(
    ("fields", "field_path"),
    [
        ({"messages": turns(("user", "Hi"), ("robot", "x"))}, "messages[1].role"),
        ({"messages": turns(("user", "refused"))}, "messages"),
        ({"messages": turns(("user", "Hi")), "prompt": "also"}, "messages"),
        ({"messages": turns(("user", "Hi")), "prompt_token_ids": [1]}, "messages"),
        ({"prompt": "refused", "chat": True}, "chat"),
    ],
)
def test_a_bad_conversation_is_named_by_its_field(fields, field_path):
    with pytest.raises(InvalidRequestError) as info:
        decode(**fields)
    assert info.value.field == field_path


def _unknown_field_turn() -> inference_pb2.ChatMessage:
    """A turn carrying field 99, which this worker does not know (a newer client's)."""
    known = inference_pb2.ChatMessage(role="user", content="a").SerializeToString()
    return inference_pb2.ChatMessage.FromString(known + b"\x98\x06\x01")


@pytest.mark.parametrize(
    ("request_type", "from_pb"),
    [
        (inference_pb2.GenerateRequest, convert.generate_request_from_pb),
        (inference_pb2.TokenizeRequest, convert.tokenize_request_from_pb),
    ],
    ids=["generate", "tokenize"],
)
@pytest.mark.parametrize(
    ("num_turns", "num_tools", "field"), [(100_000, 0, "messages"), (1, 10_000, "tools")]
)
def test_too_many_turns_or_tools_are_refused_before_the_request_is_read(
    request_type, from_pb, num_turns, num_tools, field
):
    # NOTE: read first, the last turn's unknown field would be named (messages[n].#99).
    messages = turns(("user", "a")) * num_turns + [_unknown_field_turn()]
    tools = [inference_pb2.Tool(name=f"f{i}") for i in range(num_tools)]
    with pytest.raises(InvalidRequestError) as info:
        from_pb(request_type(messages=messages, tools=tools))
    assert info.value.field == field


def test_conversations_from_dicts_carry_calls_and_results():
    call = ToolCall("call_1", "f", "{}")
    conversation = Conversation.of(
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        ],
        [Tool("f")],
    )
    assert conversation.messages == (
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "42", tool_call_id="call_1"),
    )
    assert conversation.tools == (Tool("f"),) and conversation.parses_tool_calls


def test_conversations_from_dicts_refuse_what_is_not_a_turn():
    assert Conversation.of([{"role": "user", "content": "Hi"}]).messages == (
        ChatMessage("user", "Hi"),
    )
    with pytest.raises(InvalidRequestError, match="^messages: "):
        Conversation.of([{"content": "no role"}])
    with pytest.raises(InvalidRequestError, match="^messages: "):
        Conversation.of([])


def test_unset_max_tokens_fills_the_model_length():
    request = inference_pb2.GenerateRequest(prompt="Hello")  # no stop conditions at all
    call = convert.generate_request_from_pb(request)
    assert call.params.max_tokens is None
    prepared = engine().prepare(call.prompt, call.params)
    assert prepared.params.max_tokens == MAX_MODEL_LEN - len("Hello")


def test_the_heartbeat_carries_preemptions_and_prefix_cache_counts():
    load = EngineLoad(
        1, 2, 3, 4, num_preemptions=5, num_prefix_queried_tokens=6, num_prefix_hit_tokens=7
    )
    msg = convert.heartbeat_request_to_pb("w-0", load)
    assert isinstance(msg, worker_pb2.HeartbeatRequest)
    assert (msg.num_preemptions, msg.num_prefix_queried_tokens, msg.num_prefix_hit_tokens) == (
        5,
        6,
        7,
    )
