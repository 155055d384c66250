"""`GenerateRequest.n` over the worker's gRPC server: one call streams every choice, each chunk
tagged with its index; the choices fork the prompt's KV blocks instead of computing it n times;
the call takes n stream slots; cancelling it frees every choice's blocks. Real SmolLM2 (paged,
prefix caching off, so that only the fork can share blocks) behind a loopback port."""

from __future__ import annotations

import time

import grpc
import pytest
from intentserve.common.field_errors import violation_of
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.engine.builder import EngineBuilder
from intentserve.worker.service.server import WorkerServer

pytestmark = [pytest.mark.model, pytest.mark.integration]

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 6
BLOCK_SIZE = 16
MAX_TOKENS = 12
MAX_NUM_SEQS = 4
MAX_STREAMS = 4


@pytest.fixture(scope="module")
def engine():
    return (
        EngineBuilder()
        .model("smollm2-135m")
        .paged_attention("on", prefix_caching="off", block_size=BLOCK_SIZE)
        .kv_cache_memory(bytes=32 << 20)
        .scheduler(max_model_len=512, max_num_seqs=MAX_NUM_SEQS)
        .build()
    )


@pytest.fixture(scope="module")
def server(engine):
    with WorkerServer(engine, "w-n", "smollm2-135m", max_streams=MAX_STREAMS) as server:
        yield server


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def sampled(seed: int, n: int = 0, max_tokens: int = MAX_TOKENS) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        request_id="story",
        prompt=PROMPT,
        n=n,
        sampling=inference_pb2.SamplingParams(temperature=0.9, top_p=0.95, seed=seed),
        stop=inference_pb2.StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


def wait_idle(server, engine, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.loop.load().num_kv_used:
        time.sleep(0.02)
    kv = engine.scheduler.stats().kv
    assert (kv.num_used_blocks, kv.num_free_blocks) == (0, kv.num_blocks)
    assert engine.scheduler.num_unfinished == 0


def test_three_choices_stream_on_one_call_fork_the_prompt_and_equal_three_seeded_calls(
    stub, server, engine
):
    alone = [
        [t for chunk in stub.Generate(sampled(seed), timeout=120) for t in chunk.token_ids]
        for seed in (7, 8, 9)
    ]
    assert len({tuple(a) for a in alone}) > 1  # the seeds make different samples
    num_prompt_tokens = len(engine.tokenize(PROMPT))
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    last = {}
    peak_blocks = 0
    for chunk in stub.Generate(sampled(7, n=3), timeout=120):
        peak_blocks = max(peak_blocks, server.loop.load().num_kv_used)
        assert chunk.request_id == "story"
        assert chunk.index not in last  # nothing after a choice's last chunk
        tokens[chunk.index] += chunk.token_ids
        if chunk.finish_reason:
            last[chunk.index] = chunk
    assert [tokens[i] for i in range(3)] == alone
    assert all(c.finish_reason == inference_pb2.FINISH_REASON_LENGTH for c in last.values())
    assert {(c.num_prompt_tokens, c.num_output_tokens) for c in last.values()} == {
        (num_prompt_tokens, MAX_TOKENS)
    }
    # Three calls would each hold the whole prompt's blocks; forked, its full blocks are shared.
    separately = 3 * -(-num_prompt_tokens // BLOCK_SIZE)
    shared = (num_prompt_tokens - 1) // BLOCK_SIZE
    forked = shared + 3 * -(-(num_prompt_tokens - shared * BLOCK_SIZE + MAX_TOKENS) // BLOCK_SIZE)
    assert 0 < peak_blocks <= forked < separately
    wait_idle(server, engine)


def test_cancelling_the_call_frees_every_choices_blocks(stub, server, engine):
    call = stub.Generate(sampled(3, n=3, max_tokens=400), timeout=120)
    seen = set()
    for chunk in call:
        seen.add(chunk.index)
        if seen == {0, 1, 2}:
            break
    assert server.loop.load().num_kv_used > 0
    call.cancel()
    wait_idle(server, engine)


def test_n_takes_n_slots_and_past_max_num_seqs_is_invalid_naming_n(stub, server, engine):
    holder = stub.Generate(sampled(1, n=3, max_tokens=400), timeout=120)
    next(holder)
    with pytest.raises(grpc.RpcError) as full:
        next(stub.Generate(sampled(2, n=2), timeout=30))  # 3 + 2 slots of 4
    assert full.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    holder.cancel()
    wait_idle(server, engine)
    with pytest.raises(grpc.RpcError) as error:
        next(stub.Generate(sampled(2, n=MAX_NUM_SEQS + 1), timeout=30))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    violation = violation_of(error.value)
    assert violation.field == "n" and str(MAX_NUM_SEQS) in violation.description
