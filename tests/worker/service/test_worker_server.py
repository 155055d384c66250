"""The worker's gRPC server end to end: a real engine (SmolLM2, paged) behind a real loopback port.

One engine for the module (building it dequantizes the GGUF); every test leaves it idle.
"""

from __future__ import annotations

import json
import math
import threading
import time

import grpc
import jsonschema
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from intentserve.common.field_errors import violation_of
from intentserve.v1 import (
    common_pb2,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service import convert
from intentserve.worker.service.engine_loop import EngineLoopClosedError
from intentserve.worker.service.server import WorkerServer

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
NUM_TOKENS = 8
MAX_STREAMS = 2  # small, so the overload test can fill every slot
LONG = 200  # max_tokens of a stream that is cancelled long before it could finish


@pytest.fixture(scope="module")
def engine():
    return (
        EngineBuilder()
        .model(MODEL)
        .paged_attention("on")
        .kv_cache_memory(bytes=32 << 20)
        .scheduler(max_model_len=256, max_num_seqs=8)
        .build()
    )


@pytest.fixture(scope="module")
def reference(engine):
    """The engine's own greedy output, computed directly before any server exists."""
    params = SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
    return engine.generate([PROMPT], params)[0]


@pytest.fixture(scope="module")
def server(engine, reference):
    with WorkerServer(engine, "worker-t", MODEL, max_streams=MAX_STREAMS) as server:
        yield server


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return inference_pb2_grpc.InferenceStub(channel)


def request(prompt: str = PROMPT, max_tokens: int = NUM_TOKENS, **stop_fields):
    stop_fields.setdefault("ignore_eos", True)
    return inference_pb2.GenerateRequest(
        prompt=prompt, stop=inference_pb2.StopConditions(max_tokens=max_tokens, **stop_fields)
    )


def assert_idle(server, engine, timeout_s: float = 15.0) -> None:
    """The request's sequence is gone and its blocks are free again (polls: aborts are async)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = server.loop.load()
        if (load.num_running, load.num_waiting, load.num_kv_used) == (0, 0, 0):
            break
        time.sleep(0.05)
    assert server.loop.load().num_kv_used == 0
    assert engine.scheduler.num_unfinished == 0
    assert engine.scheduler.stats().kv.num_used_blocks == 0


@pytest.mark.integration
def test_generate_streams_the_engines_greedy_output(stub, reference):
    chunks = list(stub.Generate(request(), timeout=60))
    assert len(chunks) >= 2
    assert [t for c in chunks for t in c.token_ids] == list(reference.new_token_ids)
    assert "".join(c.text for c in chunks) == reference.new_text
    last = chunks[-1]
    assert last.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert all(c.finish_reason == inference_pb2.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    assert (last.num_prompt_tokens, last.num_output_tokens) == (
        reference.num_prompt_tokens,
        NUM_TOKENS,
    )
    assert {(c.worker_id, c.request_id) for c in chunks} == {("worker-t", chunks[0].request_id)}


@pytest.mark.integration
def test_logprobs_and_sampling_options_travel_over_grpc(stub, engine, reference):
    msg = request()
    msg.sampling.logprobs, msg.sampling.prompt_logprobs = 2, 1
    chunks = list(stub.Generate(msg, timeout=60))
    token_ids = [t for c in chunks for t in c.token_ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    assert token_ids == list(reference.new_token_ids)  # greedy: the same tokens
    assert [lp.chosen.token_id for lp in logprobs] == token_ids
    assert all(len(lp.top) == 2 and lp.top[0].token_id == lp.chosen.token_id for lp in logprobs)
    prompt = chunks[0].prompt_logprobs
    assert [e.chosen.token_id for e in prompt] == engine.tokenizer.encode(PROMPT)
    assert not prompt[0].chosen.HasField("logprob") and prompt[1].chosen.logprob < 0
    assert not any(c.prompt_logprobs for c in chunks[1:])
    banned = request()
    banned.sampling.logit_bias[reference.new_token_ids[0]] = -100.0
    first = next(iter(stub.Generate(banned, timeout=60)))
    assert first.token_ids[0] != reference.new_token_ids[0]
    unknown = inference_pb2.GenerateRequest()
    unknown.ParseFromString(request().SerializeToString() + bytes([0xF8, 0x07, 0x01]))
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(unknown, timeout=30))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("#127: ")


@pytest.mark.integration
def test_structured_outputs_travel_over_grpc(stub, server, engine):
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "rank": {"type": "integer"}},
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    msg = request(prompt="The capital of France as JSON:", max_tokens=40, ignore_eos=False)
    msg.sampling.constraint.json_schema = json.dumps(schema)
    chunks = list(stub.Generate(msg, timeout=120))
    assert chunks[-1].finish_reason == inference_pb2.FINISH_REASON_STOP
    jsonschema.validate(json.loads("".join(c.text for c in chunks)), schema)
    choice = request(prompt="Is the sky blue?", max_tokens=10, ignore_eos=False)
    choice.sampling.constraint.choice.choices.extend(["yes", "no"])
    assert "".join(c.text for c in stub.Generate(choice, timeout=60)) in ("yes", "no")
    bad = request()
    bad.sampling.constraint.regex = "a(b"
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(bad, timeout=30))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("sampling.constraint.regex: ")
    assert "unclosed group" in error.value.details()
    assert_idle(server, engine)


@pytest.mark.integration
def test_stop_string_ends_the_stream(stub, reference):
    cut = len(reference.new_text) // 2
    stop = reference.new_text[cut : cut + 2]
    expected = reference.new_text[: reference.new_text.find(stop)]
    chunks = list(stub.Generate(request(stop=[stop]), timeout=60))
    assert "".join(c.text for c in chunks) == expected
    assert chunks[-1].finish_reason == inference_pb2.FINISH_REASON_STOP
    assert chunks[-1].num_output_tokens < NUM_TOKENS


@pytest.mark.integration
@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_client_cancel_or_deadline_aborts_and_frees_blocks(stub, server, engine, how):
    if how == "cancel":
        call = stub.Generate(request(max_tokens=LONG), timeout=60)
        next(call)
        assert server.loop.load().num_kv_used > 0
        call.cancel()
        expected = grpc.StatusCode.CANCELLED
    else:
        call = stub.Generate(request(max_tokens=LONG), timeout=1.0)
        expected = grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == expected
    assert_idle(server, engine)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("msg", "field_path"),
    [
        (request(prompt=""), "prompt"),
        (request(max_tokens=0), "stop.max_tokens"),
        (request(max_tokens=1000), "stop.max_tokens"),  # beyond max_model_len=256
        (request(prompt="hello " * 300), "prompt"),  # longer than max_model_len
        (
            inference_pb2.GenerateRequest(
                prompt=PROMPT,
                sampling=inference_pb2.SamplingParams(temperature=-1.0),
                stop=inference_pb2.StopConditions(max_tokens=4),
            ),
            "sampling.temperature",
        ),
        (
            inference_pb2.GenerateRequest(
                prompt=PROMPT,
                sampling=inference_pb2.SamplingParams(temperature=math.inf),
                stop=inference_pb2.StopConditions(max_tokens=4),
            ),
            "sampling.temperature",
        ),
        (
            inference_pb2.GenerateRequest(
                prompt=PROMPT,
                sampling=inference_pb2.SamplingParams(top_p=1.5),
                stop=inference_pb2.StopConditions(max_tokens=4),
            ),
            "sampling.top_p",
        ),
        (
            inference_pb2.GenerateRequest(
                request_id="r" * (512 << 10),
                prompt=PROMPT,
                stop=inference_pb2.StopConditions(max_tokens=4),
            ),
            "request_id",
        ),
        (request(prompt="hello " * 650_000), "prompt"),  # 3.9 MB: refused before tokenizing
        (request(prompt="\x04\x06"), "prompt"),  # SmolLM2's tokenizer drops both: no tokens
    ],
    ids=[
        "empty_prompt",
        "max_tokens_0",
        "max_tokens_over_len",
        "prompt_too_long",
        "temp",
        "temp_inf",
        "top_p",
        "request_id_512KiB",
        "prompt_3.9MB",
        "no_tokens",
    ],
)
def test_invalid_request_is_invalid_argument_naming_the_field(
    stub, server, engine, msg, field_path
):
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(msg, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field_path}: ")
    assert len(info.value.details()) < 1000  # the value sent is never echoed whole
    violation = violation_of(info.value)  # the google.rpc.BadRequest detail
    assert violation is not None and violation.field == field_path
    assert engine.scheduler.num_unfinished == 0


GENERATE = "/intentserve.v1.Inference/Generate"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("raw", "details"),
    [
        (b"\x12\x03\xff\xfe\xfd", "prompt: "),  # field 2, 3 bytes that are not UTF-8
        (b"\x12\x02hi\x2a\x05\x1a\x03\xc3\x28!", "stop.stop: "),  # in a nested message
        (b"\x12\x40hi", "prompt: "),  # a length that runs past the end
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "GenerateRequest: "),
    ],
    ids=["invalid_utf8", "nested_invalid_utf8", "truncated", "garbage"],
)
def test_malformed_bytes_are_invalid_argument_naming_the_field(channel, engine, raw, details):
    generate = channel.unary_stream(
        GENERATE,
        request_serializer=None,
        response_deserializer=inference_pb2.GenerateResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        list(generate(raw, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith(details)
    assert engine.scheduler.num_unfinished == 0


def timed_stream(stub, num_tokens: int) -> float:
    started_s = time.monotonic()
    chunks = list(stub.Generate(request(max_tokens=num_tokens), timeout=60))
    assert chunks[-1].num_output_tokens == num_tokens
    return time.monotonic() - started_s


@pytest.mark.integration
def test_a_huge_prompt_does_not_slow_a_concurrent_stream(stub, server, engine):
    """Another client's 3.9 MB prompt (under the 4 MB message limit) beside a 32-token stream:
    the stream takes about as long as alone (both best of two, measured here)."""
    huge = request(prompt="hello world " * 325_000)
    errors: list[grpc.RpcError] = []

    def send_huge() -> None:
        try:
            list(stub.Generate(huge, timeout=60))
        except grpc.RpcError as error:
            errors.append(error)

    def beside_huge() -> float:
        sender = threading.Thread(target=send_huge)
        sender.start()
        elapsed_s = timed_stream(stub, 32)
        sender.join(60)
        return elapsed_s

    baseline_s = min(timed_stream(stub, 32) for _ in range(2))
    beside_s = min(beside_huge() for _ in range(2))
    print(f"32-token stream: {baseline_s:.2f} s alone, {beside_s:.2f} s beside a 3.9 MB prompt")
    assert [e.code() for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert beside_s < 1.5 * baseline_s
    assert_idle(server, engine)


@pytest.mark.integration
def test_a_failing_step_is_internal_and_the_loop_keeps_serving(
    stub, channel, server, engine, monkeypatch
):
    def failing_run(*args, **kwargs):
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(engine.runner, "run", failing_run)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request(prompt="Once upon a time"), timeout=30))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "injected step failure" in info.value.details()
    # One failed step does not take the worker out of rotation (see step_health).
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    monkeypatch.undo()
    assert_idle(server, engine)
    chunks = list(stub.Generate(request(max_tokens=2), timeout=60))
    assert chunks[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert server.loop.is_running


@pytest.mark.integration
def test_streams_past_max_streams_are_resource_exhausted(stub, server, engine):
    calls = [stub.Generate(request(max_tokens=LONG), timeout=60) for _ in range(MAX_STREAMS)]
    for call in calls:
        next(call)  # each stream now holds its slot
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request(), timeout=30))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for call in calls:
        call.cancel()
    assert_idle(server, engine)
    # The cancelled streams give their slots back.
    deadline = time.monotonic() + 15.0
    while True:
        try:
            assert len(list(stub.Generate(request(max_tokens=1), timeout=30))) == 1
            break
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "stream slots were not released"
            time.sleep(0.05)


@pytest.mark.integration
def test_loop_abort_frees_blocks_and_ends_the_stream(server, engine):
    stream = server.loop.submit(PROMPT, SamplingParams(max_tokens=LONG, ignore_eos=True))
    first = next(stream)
    assert server.loop.load().num_kv_used > 0
    assert server.loop.abort(stream.request_id) is True
    assert server.loop.load().num_kv_used == 0
    assert engine.scheduler.stats().kv.num_used_blocks == 0
    rest = list(stream)
    assert rest[-1].finished and rest[-1].finish_reason is FinishReason.ABORT
    assert rest[-1].num_prompt_tokens == first.num_prompt_tokens
    assert server.loop.abort(stream.request_id) is False


@pytest.mark.model
def test_chat_prompt_is_rendered_through_the_template(engine):
    msg = inference_pb2.GenerateRequest(
        prompt="Hi there", chat=True, stop=inference_pb2.StopConditions(max_tokens=4)
    )
    call = convert.generate_request_from_pb(msg)
    prepared = engine.prepare(call.prompt, call.params, chat=call.chat)
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert "Hi there" in text and text != "Hi there"
    assert list(prepared.prompt_ids) == engine.tokenizer.encode(text)


@pytest.mark.integration
def test_info_reports_the_realized_paged_cache(channel, engine):
    info = worker_pb2_grpc.WorkerInfoServiceStub(channel).Info(worker_pb2.InfoRequest(), timeout=10)
    cache = engine.realized.cache
    assert (info.worker_id, info.model) == ("worker-t", MODEL)
    assert info.realized.cache_kind == common_pb2.CACHE_KIND_PAGED
    assert info.realized.scheduler == common_pb2.SCHEDULER_KIND_PAGED
    assert info.realized.block_size == cache.block_size > 0
    assert info.realized.num_blocks == cache.num_blocks > 0
    assert info.realized.max_model_len == 256


@pytest.mark.integration
def test_health_is_serving_and_reflection_lists_the_services(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "intentserve.v1.Inference", "intentserve.v1.WorkerInfoService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    query = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = list(reflection.ServerReflectionInfo(iter([query]), timeout=10))
    names = {s.name for s in reply.list_services_response.service}
    assert {"intentserve.v1.Inference", "grpc.health.v1.Health"} <= names


@pytest.mark.integration
def test_stop_goes_not_serving_and_ends_streams_in_flight(server, engine):
    """A second server over the same (idle) engine, so the module's server keeps running."""
    other = WorkerServer(engine, "worker-stop", MODEL).start()
    stream = other.loop.submit(PROMPT, SamplingParams(max_tokens=LONG, ignore_eos=True))
    next(stream)
    other.stop(grace_s=0)
    with pytest.raises(EngineLoopClosedError):
        list(stream)
    reply = other.health.Check(health_pb2.HealthCheckRequest(service=""), None)
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert not other.loop.is_running
    with pytest.raises(EngineLoopClosedError):
        other.loop.submit(PROMPT, SamplingParams(max_tokens=2))
    assert_idle(other, engine)


@pytest.mark.integration
@pytest.mark.parametrize("temperature", [1e-38, 1e-40])
def test_a_tiny_temperature_harms_no_stream_beside_it(server, engine, reference, temperature):
    """The poison request of the issue among six innocent streams, through a real server: it
    behaves as greedy, and every stream ends as the engine's greedy output."""
    poison = request()
    poison.sampling.temperature = temperature
    poison.sampling.seed = 1
    with (
        WorkerServer(engine, "worker-poison", MODEL, max_streams=8) as other,
        grpc.insecure_channel(other.address) as other_channel,
    ):
        other_stub = inference_pb2_grpc.InferenceStub(other_channel)
        calls = [other_stub.Generate(request(), timeout=60) for _ in range(6)]
        calls.append(other_stub.Generate(poison, timeout=60))
        for call in calls:
            chunks = list(call)
            assert [t for c in chunks for t in c.token_ids] == list(reference.new_token_ids)
            assert chunks[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert_idle(other, engine)
