"""`spec.scheduler.streamInterval`: a stream's tokens go out `n` at a time (the first at once, the
last with whatever is held), on the worker's multiplexed call and on its own Inference call, and
no token or character is lost on the way: not at the end, not at a cancel, not at a failure."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from intentserve.v1 import inference_pb2, inference_pb2_grpc
from intentserve.worker.engine.request import LogprobEntry, OutputLogprobs, RequestOutput
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.engine.tool_calls import ToolCall
from intentserve.worker.sched.sequence import FinishReason
from intentserve.worker.service.engine_loop import EngineLoop
from intentserve.worker.service.request_stream import Outbox, RequestFailedError, RequestStream
from intentserve.worker.service.server import WorkerServer

from tests.worker.service.test_mux import Mux, request, tokens

NUM_TOKENS = 10


def output(token: int, num_output: int, finished: bool = False) -> RequestOutput:
    reason = FinishReason.LENGTH if finished else None
    return RequestOutput("r", (token,), f"<{token}>", finished, reason, 5, num_output)


def delivered(outbox: Outbox) -> list[object]:
    outbox.flush()
    outbox.close()
    items = []
    while batch := outbox.get(0):
        items += [item for _, item in batch]
    return items


def test_tokens_go_out_n_at_a_time_the_first_at_once_the_last_with_the_rest():
    outbox = Outbox()
    stream = RequestStream("r", lambda s: None, outbox, key=7, stream_interval=4)
    for i in range(1, NUM_TOKENS + 1):
        stream._put(output(i, i, finished=i == NUM_TOKENS))
    items = delivered(outbox)
    assert [len(o.new_token_ids) for o in items] == [1, 4, 4, 1]
    assert [t for o in items for t in o.new_token_ids] == list(range(1, NUM_TOKENS + 1))
    assert "".join(o.new_text for o in items) == "".join(f"<{i}>" for i in range(1, 11))
    assert [o.finished for o in items] == [False, False, False, True]
    assert items[-1].finish_reason is FinishReason.LENGTH
    assert [o.num_output_tokens for o in items] == [1, 5, 9, 10]
    assert stream.finished


def test_held_outputs_keep_their_logprobs_and_tool_calls():
    outbox = Outbox()
    stream = RequestStream("r", lambda s: None, outbox, key=7, stream_interval=4)
    for i in range(1, NUM_TOKENS + 1):
        chosen = LogprobEntry(i, f"<{i}>", -float(i))
        stream._put(
            dataclasses.replace(
                output(i, i, finished=i == NUM_TOKENS),
                logprobs=(OutputLogprobs(chosen, ()),),
                tool_calls=(ToolCall(f"call_{i}", "f", "{}"),) if i % 3 == 0 else (),
            )
        )
    items = delivered(outbox)
    assert [e.chosen.token_id for o in items for e in o.logprobs] == list(range(1, 11))
    assert [c.id for o in items for c in o.tool_calls] == ["call_3", "call_6", "call_9"]


def test_an_interval_of_one_delivers_every_output_as_it_comes():
    outbox = Outbox()
    stream = RequestStream("r", lambda s: None, outbox, key=1)
    for i in range(1, 4):
        stream._put(output(i, i, finished=i == 3))
    assert [o.new_token_ids for o in delivered(outbox)] == [(1,), (2,), (3,)]


def test_an_abort_carries_the_tokens_held_back():
    outbox = Outbox()
    stream = RequestStream("r", lambda s: None, outbox, key=1, stream_interval=8)
    for i in range(1, 4):
        stream._put(output(i, i))
    stream._put_aborted()
    items = delivered(outbox)
    assert [o.new_token_ids for o in items] == [(1,), (2, 3)]
    assert items[-1].finish_reason is FinishReason.ABORT
    assert items[-1].new_text == "<2><3>"


@pytest.mark.parametrize("with_outbox", [True, False])
def test_a_failure_delivers_the_held_tokens_before_the_error(with_outbox):
    outbox = Outbox() if with_outbox else None
    stream = RequestStream("r", lambda s: None, outbox, key=1, stream_interval=8)
    for i in range(1, 4):
        stream._put(output(i, i))
    error = RequestFailedError("r", "the sampler saw NaN")
    stream._fail(error)
    if with_outbox:
        items = delivered(outbox)
    else:
        items = []
        with pytest.raises(RequestFailedError):
            for item in stream:
                items.append(item)
        items.append(error)
    assert [o.new_token_ids for o in items[:-1]] == [(1,), (2, 3)]
    assert items[-1] is error


def test_the_interval_must_be_a_positive_count(tiny_engine):
    with pytest.raises(ValueError, match="stream_interval: 0; allowed: an integer >= 1"):
        EngineLoop(tiny_engine(), stream_interval=0)


@pytest.mark.integration
def test_served_tokens_go_out_n_at_a_time_on_both_calls(tiny_engine, caplog):
    caplog.set_level("INFO", logger="intentserve.worker.service.server")
    engine = tiny_engine(max_model_len=128, max_num_seqs=4)
    reference = engine.generate(["hello"], SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))
    with WorkerServer(engine, "w-si", "tiny", stream_interval=4) as server:
        mux = Mux(server.address)
        try:
            mux.start(1, request("hello", max_tokens=NUM_TOKENS))
            events = mux.wait(1)
        finally:
            mux.close()
        with grpc.insecure_channel(server.address) as channel:
            chunks = list(
                inference_pb2_grpc.InferenceStub(channel).Generate(
                    request("hello", max_tokens=NUM_TOKENS), timeout=30
                )
            )
    assert [len(e.output.token_ids) for e in events] == [1, 4, 4, 1]
    assert tokens(events) == list(reference[0].new_token_ids)
    assert "".join(e.output.text for e in events) == reference[0].new_text
    assert [len(c.token_ids) for c in chunks] == [1, 4, 4, 1]
    assert [t for c in chunks for t in c.token_ids] == list(reference[0].new_token_ids)
    assert chunks[-1].finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert "streaming 4 tokens a message after the first" in caplog.text
