"""Proto <-> engine conversion and the exception -> status mapping; no model, no server."""

from __future__ import annotations

import math
from types import SimpleNamespace

import grpc
import pytest
from intentserve.common.status import lookup
from intentserve.policy import IntentError, PagedAttentionRequiredError, Reason, ReasonCode
from intentserve.v1 import inference_pb2
from intentserve.worker.engine.engine import Engine
from intentserve.worker.engine.grammar import GrammarCompiler
from intentserve.worker.engine.request import PreparedRequest, RequestOutput
from intentserve.worker.engine.sampling import InvalidRequestError
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoad, EngineLoopClosedError
from intentserve.worker.service.interceptor import STATUS_CODES
from intentserve.worker.service.servicer import WorkerOverloadedError


class FakeTokenizer:
    """One token per character, save U+0004, which it drops (as SmolLM2's tokenizer does); a
    chat template that wraps the user's turn. It counts the texts it tokenizes."""

    vocab_size = 100
    num_encoded = 0

    def encode(self, text: str) -> list[int]:
        FakeTokenizer.num_encoded += 1
        return [ord(c) % self.vocab_size for c in text if c != "\x04"]

    def min_num_tokens(self, utf8: bytes) -> int:
        return -(-len(utf8.replace(b"\x04", b"")) // 4)  # a character has at most 4 bytes

    def apply_chat_template(self, messages):
        return f"<user>{messages[0]['content']}</user><assistant>"


def fake_engine(max_model_len: int = 64) -> Engine:
    """The engine's request checks need only its tokenizer, vocabulary and max_model_len."""
    runner = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=100)))
    tokenizer = FakeTokenizer()
    return Engine(
        tokenizer=tokenizer,
        scheduler=None,
        runner=runner,
        realized=None,
        grammars=GrammarCompiler(tokenizer),
        max_model_len=max_model_len,
    )


def request(**fields) -> inference_pb2.GenerateRequest:
    fields.setdefault("prompt", "Hello")
    fields.setdefault("stop", inference_pb2.StopConditions(max_tokens=4))
    return inference_pb2.GenerateRequest(**fields)


def decode(msg: inference_pb2.GenerateRequest) -> PreparedRequest:
    """What the servicer does: the proto fields, then the engine's checks, fields named as sent."""
    call = convert.generate_request_from_pb(msg)
    with convert.proto_field_names():
        return fake_engine().prepare(call.prompt, call.params, call.request_id, chat=call.chat)


def test_defaults_and_carried_fields():
    call = convert.generate_request_from_pb(
        request(
            request_id="r1",
            sampling=inference_pb2.SamplingParams(temperature=0.5, top_k=7, seed=3),
            stop=inference_pb2.StopConditions(
                max_tokens=9, stop_token_ids=[5], stop=["\n"], ignore_eos=True
            ),
        )
    )
    assert (call.prompt, call.request_id, call.chat) == ("Hello", "r1", False)
    params = call.params
    assert params.max_tokens == 9 and params.top_k == 7 and params.seed == 3
    assert params.temperature == pytest.approx(0.5)
    assert params.top_p == 1.0  # 0 on the wire means "not set"
    assert params.stop_token_ids == (5,) and params.stop == ("\n",) and params.ignore_eos


def test_unset_seed_and_generated_request_ids():
    first, second = decode(request()), decode(request())
    assert convert.generate_request_from_pb(request()).request_id is None  # the engine names it
    assert first.params.seed is None and first.params.temperature == 0.0
    assert first.request_id.startswith("req-") and first.request_id != second.request_id
    assert decode(request(request_id="mine")).request_id == "mine"


def test_token_ids_take_precedence_and_chat_renders_one_user_message():
    assert decode(request(prompt="ignored", prompt_token_ids=[1, 2])).prompt_ids == (1, 2)
    chat = decode(request(prompt="Hi", chat=True))
    assert chat.prompt_ids == tuple(FakeTokenizer().encode("<user>Hi</user><assistant>"))


@pytest.mark.parametrize(
    ("fields", "field_path"),
    [
        ({"prompt": ""}, "prompt"),
        ({"stop": inference_pb2.StopConditions(max_tokens=0)}, "stop.max_tokens"),
        ({"stop": inference_pb2.StopConditions(max_tokens=4, stop=[""])}, "stop.stop"),
        ({"sampling": inference_pb2.SamplingParams(temperature=-0.1)}, "sampling.temperature"),
        ({"sampling": inference_pb2.SamplingParams(temperature=math.nan)}, "sampling.temperature"),
        ({"sampling": inference_pb2.SamplingParams(temperature=math.inf)}, "sampling.temperature"),
        ({"sampling": inference_pb2.SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ({"sampling": inference_pb2.SamplingParams(top_p=-0.1)}, "sampling.top_p"),
        ({"sampling": inference_pb2.SamplingParams(top_p=math.nan)}, "sampling.top_p"),
        ({"stop": inference_pb2.StopConditions(max_tokens=4, stop=["x"] * 33)}, "stop.stop"),
        ({"stop": inference_pb2.StopConditions(max_tokens=4, stop=["x" * 1025])}, "stop.stop"),
        (
            {"stop": inference_pb2.StopConditions(max_tokens=4, stop_token_ids=[1] * 1025)},
            "stop.stop_token_ids",
        ),
        ({"prompt": "\x04\x04"}, "prompt"),  # the tokenizer drops all of it: no tokens
        ({"request_id": "r" * 257}, "request_id"),
        ({"request_id": "r" * (512 << 10)}, "request_id"),
        ({"request_id": "two\nlines"}, "request_id"),
        ({"prompt_token_ids": [1] * 64}, "prompt_token_ids"),  # longer than max_model_len
        ({"prompt_token_ids": [1, 100]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1], "chat": True}, "chat"),
        ({"prompt": "x" * 64}, "prompt"),  # longer than max_model_len
        ({"stop": inference_pb2.StopConditions(max_tokens=60)}, "stop.max_tokens"),  # no room
    ],
)
def test_invalid_fields_are_named_by_their_proto_path(fields, field_path):
    with pytest.raises(InvalidRequestError) as info:
        decode(request(**fields))
    assert info.value.field == field_path
    assert str(info.value).startswith(f"{field_path}: ")


@pytest.mark.parametrize(
    ("fields", "prompt_ids", "max_tokens", "temperature", "top_p"),
    [
        ({}, (72, 1, 8, 8, 11), 4, 0.0, 1.0),
        ({"prompt": "", "prompt_token_ids": [1, 2, 3]}, (1, 2, 3), 4, 0.0, 1.0),
        ({"sampling": inference_pb2.SamplingParams(temperature=0.7, top_p=1.0)}, None, 4, 0.7, 1.0),
        ({"sampling": inference_pb2.SamplingParams(top_p=0.0)}, None, 4, 0.0, 1.0),  # 0: unset
        (
            {"sampling": inference_pb2.SamplingParams(temperature=2.0, top_p=0.01)},
            None,
            4,
            2.0,
            0.01,
        ),
    ],
)
def test_valid_requests_pass_with_the_values_sent(
    fields, prompt_ids, max_tokens, temperature, top_p
):
    prepared = decode(request(**fields))
    expected_ids = prompt_ids if prompt_ids is not None else tuple(FakeTokenizer().encode("Hello"))
    assert prepared.prompt_ids == expected_ids
    assert prepared.params.max_tokens == max_tokens
    assert prepared.params.temperature == pytest.approx(temperature)
    assert prepared.params.top_p == pytest.approx(top_p)


def test_a_prompt_longer_than_its_bytes_allow_is_refused_without_tokenizing():
    before = FakeTokenizer.num_encoded
    with pytest.raises(InvalidRequestError, match=r"^prompt: has at least 4096 tokens; at most"):
        decode(request(prompt="é" * 8192))  # 16384 bytes: at least 4096 tokens
    assert FakeTokenizer.num_encoded == before
    assert decode(request(prompt="\x04" * 200 + "Hi")).prompt_ids == (72, 5)  # dropped: no count


def test_engine_errors_are_renamed_to_proto_paths():
    with (
        pytest.raises(InvalidRequestError, match=r"^stop\.max_tokens: 300 does not fit"),
        convert.proto_field_names(),
    ):
        raise InvalidRequestError("max_tokens", "300 does not fit")
    with (
        pytest.raises(InvalidRequestError, match=r"^request_id: taken"),
        convert.proto_field_names(),
    ):
        raise InvalidRequestError("request_id", "taken")


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (None, inference_pb2.FINISH_REASON_UNSPECIFIED),
        (FinishReason.STOP, inference_pb2.FINISH_REASON_STOP),
        (FinishReason.LENGTH, inference_pb2.FINISH_REASON_LENGTH),
        (FinishReason.ABORT, inference_pb2.FINISH_REASON_ABORT),
    ],
)
def test_response_finish_reason_and_counts(reason, expected):
    finished = reason is not None
    output = RequestOutput("r1", (4, 5), "ab", finished, reason, 7, 2)
    msg = convert.generate_response_to_pb(output, "w0")
    assert msg.finish_reason == expected
    assert (msg.request_id, list(msg.token_ids), msg.text) == ("r1", [4, 5], "ab")
    assert msg.worker_id == "w0"
    assert msg.num_output_tokens == 2
    assert msg.num_prompt_tokens == (7 if finished else 0)  # set on the last chunk only


def test_the_stop_string_that_ended_a_request_is_in_its_last_response():
    output = RequestOutput("r1", (4,), "a", True, FinishReason.STOP, 7, 1, stop_string="\n\n")
    assert convert.generate_response_to_pb(output, "w0").stop_string == "\n\n"
    output = RequestOutput("r1", (4,), "a", True, FinishReason.STOP, 7, 1)
    assert convert.generate_response_to_pb(output, "w0").stop_string == ""  # the end of a turn


def test_heartbeat_request_carries_the_load():
    load = EngineLoad(2, 1, 10, 91, num_steps=5, total_step_s=0.125, num_step_seqs=9)
    msg = convert.heartbeat_request_to_pb("w0", load)
    assert (msg.worker_id, msg.num_running, msg.num_waiting) == ("w0", 2, 1)
    assert (msg.num_kv_used, msg.num_kv_total) == (10, 91)
    assert (msg.num_steps, msg.total_step_s, msg.num_step_seqs) == (5, 0.125, 9)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequestError("prompt", "must not be empty"), grpc.StatusCode.INVALID_ARGUMENT),
        (ValueError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (IntentError("policy.mode", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (
            PagedAttentionRequiredError(Reason(ReasonCode.BACKEND_UNAVAILABLE, "no backend")),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (WorkerOverloadedError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (EngineLoopClosedError("closed"), grpc.StatusCode.UNAVAILABLE),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_codes(error, code):
    got_code, message = lookup(STATUS_CODES, error)
    assert got_code == code
    assert str(error) in message
