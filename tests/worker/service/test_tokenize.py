"""A worker's Inference.Tokenize and Detokenize over a real loopback port (a tiny random-weight
engine): the ids are those Generate computes for the same prompt or conversation; refusals name
the field, with the BadRequest detail."""

from __future__ import annotations

import grpc
import pytest
from intentserve.common.field_errors import violation_of
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.service.server import WorkerServer

MAX_MODEL_LEN = 128
TEXT = "the cat sat on the mat"
UNLIMITED = SamplingParams(max_tokens=None)  # as much as the model length leaves


@pytest.fixture(scope="module")
def served(tiny_loaded):
    engine = (
        EngineBuilder()
        .paged_attention("on")
        .kv_cache_memory(bytes=1 << 20)
        .scheduler(max_model_len=MAX_MODEL_LEN, max_num_seqs=4)
        .build(loaded=tiny_loaded)
    )
    with (
        WorkerServer(engine, "w-tok", "tiny", max_streams=4) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        yield engine, inference_pb2_grpc.InferenceStub(channel)


def test_a_prompts_ids_are_the_ones_generate_computes(served):
    engine, stub = served
    reply = stub.Tokenize(inference_pb2.TokenizeRequest(prompt=TEXT), timeout=10)
    assert list(reply.tokens) == list(engine.prepare(TEXT, UNLIMITED).prompt_ids)
    assert reply.max_model_len == MAX_MODEL_LEN and not reply.token_strs


def test_a_conversations_ids_are_the_ones_a_chat_computes(served):
    engine, stub = served
    turns = [inference_pb2.ChatMessage(role="user", content=TEXT)]
    reply = stub.Tokenize(inference_pb2.TokenizeRequest(messages=turns), timeout=10)
    conversation = Conversation.of([{"role": "user", "content": TEXT}])
    expected = engine.prepare(conversation, UNLIMITED).prompt_ids
    assert list(reply.tokens) == list(expected)


def test_special_tokens_and_token_strings_as_asked(served):
    engine, stub = served
    with_bos = stub.Tokenize(
        inference_pb2.TokenizeRequest(prompt=TEXT, add_special_tokens=True, return_token_strs=True),
        timeout=10,
    )
    without = stub.Tokenize(
        inference_pb2.TokenizeRequest(prompt=TEXT, add_special_tokens=False), timeout=10
    )
    assert list(with_bos.tokens) == [engine.tokenizer.bos_token_id, *without.tokens]
    assert list(with_bos.token_strs) == [engine.tokenizer.token_text(t) for t in with_bos.tokens]


def test_detokenize_gives_the_text_back(served):
    _, stub = served
    ids = stub.Tokenize(
        inference_pb2.TokenizeRequest(prompt=TEXT, add_special_tokens=False), timeout=10
    ).tokens
    reply = stub.Detokenize(inference_pb2.DetokenizeRequest(tokens=ids), timeout=10)
    assert reply.prompt == TEXT


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.Detokenize(inference_pb2.DetokenizeRequest(tokens=[5, 10**6])), "tokens"),
        (lambda s: s.Tokenize(inference_pb2.TokenizeRequest()), "prompt"),
        (
            lambda s: s.Tokenize(
                inference_pb2.TokenizeRequest(prompt="x", tools=[inference_pb2.Tool(name="f")])
            ),
            "tools",
        ),
        (
            lambda s: s.Tokenize(
                inference_pb2.TokenizeRequest(
                    prompt="x", messages=[inference_pb2.ChatMessage(role="user", content="y")]
                )
            ),
            "messages",
        ),
    ],
    ids=["id_outside_vocab", "empty", "tools_without_messages", "both"],
)
def test_a_refusal_names_the_field(served, call, field):
    _, stub = served
    with pytest.raises(grpc.RpcError) as info:
        call(stub)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: ")
    assert violation_of(info.value).field == field
