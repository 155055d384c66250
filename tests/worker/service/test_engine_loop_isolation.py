"""The serving loop over a tiny random-weight engine (fast layer): a request that fails alone ends
its own stream; failed steps fail their batch and, three in a row, the worker's health; the
expensive part of admitting a request (tokenizing) runs off the engine loop's thread."""

from __future__ import annotations

import logging
import threading

import pytest
from grpc_health.v1 import health, health_pb2
from intentserve.worker.engine.sampler import Sampler
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service.engine_loop import EngineLoop
from intentserve.worker.service.request_stream import RequestFailedError
from intentserve.worker.service.step_health import FAILED_STEPS_NOT_SERVING, StepHealth

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
POISON_SEED = 666


@pytest.fixture
def served(tiny_engine):
    """(loop, health servicer) over a fresh tiny engine; health starts SERVING."""
    servicer = health.HealthServicer()
    servicer.set("", SERVING)
    loop = EngineLoop(tiny_engine(), health=StepHealth(servicer, [""]))
    yield loop, servicer
    loop.close()


def status(servicer) -> int:
    return servicer.Check(health_pb2.HealthCheckRequest(service=""), None).status


def test_a_request_that_fails_alone_ends_only_its_own_stream(served, monkeypatch):
    loop, servicer = served
    seeded_noise = Sampler._seeded_noise

    def failing(sampler, seq_id, params, vocab):
        if params.seed == POISON_SEED:
            raise RuntimeError("injected sampling failure")
        return seeded_noise(sampler, seq_id, params, vocab)

    monkeypatch.setattr(Sampler, "_seeded_noise", failing)
    innocents = [loop.submit(f"hello {i}", PARAMS) for i in range(4)]
    poison = loop.submit("hello", SamplingParams(max_tokens=8, temperature=1.0, seed=POISON_SEED))
    with pytest.raises(RequestFailedError, match="sampling: RuntimeError: injected") as info:
        list(poison)
    assert info.value.request_id == poison.request_id
    for stream in innocents:
        outputs = list(stream)
        assert outputs[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(o.new_token_ids) for o in outputs) == PARAMS.max_tokens
    assert status(servicer) == SERVING
    assert loop.load().num_kv_used == 0


def test_a_choice_that_fails_fails_its_request_whole_and_frees_every_choice(served, monkeypatch):
    loop, _ = served
    seeded_noise = Sampler._seeded_noise

    def failing(sampler, seq_id, params, vocab):
        if params.seed == POISON_SEED:  # choice 2 of a request seeded POISON_SEED - 2
            raise RuntimeError("injected sampling failure")
        return seeded_noise(sampler, seq_id, params, vocab)

    monkeypatch.setattr(Sampler, "_seeded_noise", failing)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, seed=POISON_SEED - 2)
    innocent = loop.submit("hello there", PARAMS)
    choices = loop.submit("hello", sampled, "three", n=3)
    with pytest.raises(RequestFailedError, match="injected") as info:
        list(choices)
    assert info.value.request_id == "three"
    assert list(innocent)[-1].finish_reason is FinishReason.LENGTH
    assert loop.load().num_kv_used == 0
    assert not loop.engine.has_unfinished


def test_three_failed_steps_in_a_row_take_health_down_and_one_good_step_brings_it_back(
    served, monkeypatch
):
    loop, servicer = served

    def failing_run(*args, **kwargs):
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(loop.engine.runner, "run", failing_run)
    for num_failed in range(1, FAILED_STEPS_NOT_SERVING + 1):
        with pytest.raises(RuntimeError, match="injected step failure"):
            list(loop.submit("hello", PARAMS))  # one request: one failed step
        expected = NOT_SERVING if num_failed == FAILED_STEPS_NOT_SERVING else SERVING
        assert status(servicer) == expected, num_failed
    monkeypatch.undo()
    assert list(loop.submit("hello", PARAMS))[-1].finish_reason is FinishReason.LENGTH
    assert status(servicer) == SERVING


def test_step_health_never_opens_a_draining_server():
    servicer = health.HealthServicer()
    step_health = StepHealth(servicer, [""], threshold=1)
    step_health.step_failed()
    assert status(servicer) == NOT_SERVING
    servicer.enter_graceful_shutdown()
    step_health.step_succeeded()
    assert status(servicer) == NOT_SERVING


def test_a_request_is_tokenized_off_the_engine_loop(served, monkeypatch):
    loop, _ = served
    tokenizer = loop.engine.tokenizer
    encode = tokenizer.encode
    threads: list[threading.Thread] = []

    def recording(text, *args, **kwargs):
        threads.append(threading.current_thread())
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", recording)
    list(loop.submit("hello world", PARAMS))
    (thread,) = threads
    assert thread.name.startswith("tokenize") and thread is not loop._thread


def test_the_load_counts_steps_their_time_and_the_sequences_each_advanced(served):
    loop, _ = served
    before = loop.load()
    streams = [loop.submit(f"hello {i}", PARAMS) for i in range(3)]
    for stream in streams:
        list(stream)
    after = loop.load()
    num_steps = after.num_steps - before.num_steps
    assert num_steps >= PARAMS.max_tokens  # one token per sequence per step at most
    assert after.total_step_s > before.total_step_s
    # each sequence advanced in one step per token it generated (its prompt's step included)
    assert after.num_step_seqs - before.num_step_seqs == 3 * PARAMS.max_tokens


def test_a_finished_request_is_one_log_line_named_by_its_request_id(served, caplog):
    loop, _ = served
    caplog.set_level(logging.INFO, logger="intentserve.worker.service.in_flight")
    list(loop.submit("hello", PARAMS, request_id="trace-7"))
    (record,) = [r for r in caplog.records if "trace-7" in r.getMessage()]
    assert record.getMessage().startswith("request trace-7 finished: length, ")
    assert record.fields["request_id"] == "trace-7"
    assert record.fields["num_output_tokens"] == PARAMS.max_tokens
