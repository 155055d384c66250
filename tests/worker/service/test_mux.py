"""`WorkerStreams.Serve` over a tiny random-weight engine behind a real loopback port: many
requests on one call, a step's news in one message, and every request keeping its own outcome
(refusal, bad field, cancel, deadline) without touching its neighbours."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest
from intentserve.common.field_errors import FieldViolation, violation_in
from intentserve.common.streaming import MAX_REQUEST_BYTES
from intentserve.v1 import inference_pb2, worker_pb2, worker_pb2_grpc
from intentserve.worker.engine.sampling import SamplingParams
from intentserve.worker.service.server import WorkerServer

pytestmark = pytest.mark.integration

NUM_TOKENS = 8
MAX_STREAMS = 6


class Mux:
    """A controller's side of one Serve call, kept simple: commands in, events collected."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.call = worker_pb2_grpc.WorkerStreamsStub(self.channel).Serve(iter(self._next, None))
        self.messages: list[worker_pb2.StreamEvents] = []
        self.events: dict[int, list[worker_pb2.StreamEvent]] = {}
        self._ended: dict[int, threading.Event] = {}
        self._num_running: dict[int, int] = {}  # key -> its choices not yet finished
        self._lock = threading.Lock()
        self.error: grpc.RpcError | None = None
        self.ended = threading.Event()  # the call's response stream is over
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _next(self):
        return self._commands.get()

    def start(self, key: int, request: inference_pb2.GenerateRequest, timeout_s: float = 0.0):
        with self._lock:
            self._ended[key] = threading.Event()
            self._num_running[key] = request.n or 1
            self.events[key] = []
        self._commands.put(worker_pb2.StreamCommand(stream=key, start=request, timeout_s=timeout_s))

    def cancel(self, key: int) -> None:
        self._commands.put(worker_pb2.StreamCommand(stream=key, cancel=True))

    def wait(self, key: int, timeout_s: float = 30.0) -> list[worker_pb2.StreamEvent]:
        assert self._ended[key].wait(timeout_s), self._story(key)
        return self.events[key]

    def _story(self, key: int) -> str:
        """What a failed wait saw: enough to tell a lost event from a call that ended."""
        with self._lock:
            counts = {k: len(events) for k, events in self.events.items()}
            got = [e.WhichOneof("event") for e in self.events[key]]
        call = "over" if self.ended.is_set() else "open"
        return (
            f"stream {key} never ended: its events {got}; events per key {counts}; "
            f"{len(self.messages)} messages; the call is {call}, error {self.error!r}"
        )

    def close(self) -> None:
        self._commands.put(None)
        self.call.cancel()
        self.channel.close()

    def _read(self) -> None:
        try:
            for message in self.call:
                with self._lock:
                    self.messages.append(message)
                    for event in message.events:
                        self.events[event.stream].append(event)
                        if event.output.finish_reason:
                            self._num_running[event.stream] -= 1
                        if event.HasField("error") or not self._num_running[event.stream]:
                            self._ended[event.stream].set()
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.ended.set()


def request(prompt: str, max_tokens: int = NUM_TOKENS, **fields) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        prompt=prompt,
        stop=inference_pb2.StopConditions(max_tokens=max_tokens, ignore_eos=True),
        **fields,
    )


def tokens(events: list[worker_pb2.StreamEvent]) -> list[int]:
    return [t for e in events if e.HasField("output") for t in e.output.token_ids]


def assert_idle(server: WorkerServer, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = server.loop.load()
        if (load.num_running, load.num_waiting, load.num_kv_used) == (0, 0, 0):
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine is not idle: {server.loop.load()}")


@pytest.fixture
def server(tiny_engine):
    engine = tiny_engine(max_model_len=128, max_num_seqs=4)
    with WorkerServer(engine, "w-mux", "tiny", max_streams=MAX_STREAMS) as server:
        yield server


@pytest.fixture
def mux(server):
    mux = Mux(server.address)
    yield mux
    mux.close()


def test_many_requests_share_one_call_and_a_step_is_one_message(server, mux):
    prompts = [f"hello number {i}" for i in range(4)]
    expected = server.loop.engine.generate(
        prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
    )
    for key, prompt in enumerate(prompts, start=1):
        mux.start(key, request(prompt))
    for key, reference in enumerate(expected, start=1):
        events = mux.wait(key)
        assert tokens(events) == list(reference.new_token_ids)
        assert "".join(e.output.text for e in events) == reference.new_text
        assert events[-1].output.finish_reason == inference_pb2.FINISH_REASON_LENGTH
        assert events[-1].output.num_prompt_tokens == reference.num_prompt_tokens
        assert {e.output.worker_id for e in events} == {"w-mux"}
    num_events = sum(len(m.events) for m in mux.messages)
    # 4 requests decoding side by side: their tokens of a step travel together.
    assert num_events >= 4 * NUM_TOKENS
    assert len(mux.messages) <= num_events / 2, (len(mux.messages), num_events)
    assert max(len(m.events) for m in mux.messages) >= 3
    assert_idle(server)


def test_a_bad_field_fails_only_its_own_request_naming_the_field(server, mux):
    mux.start(1, request("a good prompt"))
    mux.start(2, request("a bad one", max_tokens=0))
    mux.start(3, request("", max_tokens=4))
    bad = mux.wait(2)
    assert [e.WhichOneof("event") for e in bad] == ["error"]
    assert bad[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad[0].error.details.startswith("stop.max_tokens")
    assert violation_in(bad[0].error.status_details).field == "stop.max_tokens"
    empty = mux.wait(3)[0].error
    assert empty.details.startswith("prompt")
    assert violation_in(empty.status_details) == FieldViolation(
        "prompt", empty.details.removeprefix("prompt: ")
    )
    good = mux.wait(1)
    assert len(tokens(good)) == NUM_TOKENS
    assert mux.error is None  # the call itself goes on
    assert_idle(server)


def test_a_request_of_the_largest_size_forwarded_fails_alone_and_the_call_goes_on(server, mux):
    """The controller forwards requests up to MAX_REQUEST_BYTES; their start command must fit the
    worker's receive limit, or the whole call (every request on it) would end."""
    mux.start(1, request("a good prompt"))
    big = request("x")
    while big.ByteSize() < MAX_REQUEST_BYTES:
        big.prompt = "x" * (len(big.prompt) + MAX_REQUEST_BYTES - big.ByteSize())
    mux.start(2, big, timeout_s=30.0)
    refused = mux.wait(2)
    assert [e.WhichOneof("event") for e in refused] == ["error"]
    assert refused[0].error.details.startswith("prompt")  # too long for the model, named
    assert len(tokens(mux.wait(1))) == NUM_TOKENS
    assert mux.error is None  # the call itself goes on
    assert_idle(server)


def test_cancel_and_deadline_abort_their_request_and_free_its_blocks(server, mux, monkeypatch):
    engine, step = server.loop.engine, server.loop.engine.step

    def slow_step():  # 100 steps take at least a second: the 0.2 s deadline comes first
        time.sleep(0.01)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    mux.start(1, request("cancel me", max_tokens=100))
    mux.start(2, request("time me out", max_tokens=100), timeout_s=0.2)
    mux.start(3, request("finish me"))
    while not tokens(mux.events[1]):
        time.sleep(0.01)
    mux.cancel(1)
    assert mux.wait(1)[-1].output.finish_reason == inference_pb2.FINISH_REASON_ABORT
    assert mux.wait(2)[-1].output.finish_reason == inference_pb2.FINISH_REASON_ABORT
    assert len(tokens(mux.wait(2))) < 100
    assert mux.wait(3)[-1].output.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    mux.cancel(3)  # a key that already ended: ignored
    assert_idle(server)


def test_requests_past_max_streams_are_refused_one_by_one(server, mux):
    for key in range(1, MAX_STREAMS + 3):
        mux.start(key, request(f"stream {key}", max_tokens=60))
    refused = [
        key
        for key in range(1, MAX_STREAMS + 3)
        if any(e.HasField("error") for e in mux.wait(key, 60))
    ]
    assert len(refused) == 2
    for key in refused:
        error = mux.events[key][0].error
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert f"maximum of {MAX_STREAMS} streams" in error.details
    # Their slots were given back: a next request is served.
    mux.start(100, request("after"))
    assert len(tokens(mux.wait(100))) == NUM_TOKENS


def test_n_choices_stream_under_one_key_and_take_n_slots(server, mux):
    seeded = {"sampling": inference_pb2.SamplingParams(temperature=1.0, seed=5)}
    mux.start(1, request("choose", max_tokens=60, n=3, **seeded))
    mux.start(2, request("no room", n=MAX_STREAMS - 2))  # 3 + 4 slots of 6
    refused = mux.wait(2)[0].error
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    mux.start(3, request("too many", n=5))  # past maxNumSeqs (4)
    invalid = mux.wait(3)[0].error
    assert invalid.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert violation_in(invalid.status_details).field == "n"
    events = mux.wait(1)
    by_choice = {i: [e.output for e in events if e.output.index == i] for i in range(3)}
    assert all(len([t for o in outs for t in o.token_ids]) == 60 for outs in by_choice.values())
    assert all(outs[-1].finish_reason for outs in by_choice.values())
    assert len({tuple(t for o in outs for t in o.token_ids) for outs in by_choice.values()}) > 1
    assert events[-1].output.finish_reason  # nothing after the last choice's end
    # Its three slots came back with its end: a request of every slot is served.
    mux.start(4, request("after", n=4, **seeded))
    assert len(tokens(mux.wait(4))) == 4 * NUM_TOKENS
    assert_idle(server)


def test_a_duplicate_request_id_is_refused_and_its_cancel_spares_the_holder(server, mux):
    mux.start(1, request("first", max_tokens=60, request_id="shared-id"))
    while not tokens(mux.events[1]):
        time.sleep(0.01)
    mux.start(2, request("second", request_id="shared-id"))
    mux.cancel(2)
    error = mux.wait(2)[0].error
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "already in flight" in error.details
    first = mux.wait(1)
    assert first[-1].output.finish_reason == inference_pb2.FINISH_REASON_LENGTH
    assert len(tokens(first)) == 60


def test_ending_the_call_aborts_every_request_on_it(server):
    mux = Mux(server.address)
    for key in (1, 2, 3):
        mux.start(key, request(f"long {key}", max_tokens=100))
    while not all(tokens(mux.events[k]) for k in (1, 2, 3)):
        time.sleep(0.01)
    mux.close()
    assert_idle(server)
    # The slots came back: a new call can use all of them.
    other = Mux(server.address)
    try:
        for key in range(1, MAX_STREAMS + 1):
            other.start(key, request(f"again {key}", max_tokens=4))
        for key in range(1, MAX_STREAMS + 1):
            assert len(tokens(other.wait(key))) == 4
    finally:
        other.close()


def test_a_command_that_does_not_parse_ends_the_call_naming_the_field(server):
    channel = grpc.insecure_channel(server.address)
    serve = channel.stream_stream(
        "/intentserve.v1.WorkerStreams/Serve",
        request_serializer=lambda raw: raw,
        response_deserializer=worker_pb2.StreamEvents.FromString,
    )
    # Field 2 (start) with a length running past the end of the message.
    with pytest.raises(grpc.RpcError) as error:
        list(serve(iter([b"\x08\x01\x12\x50\x0a"]), timeout=10))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
