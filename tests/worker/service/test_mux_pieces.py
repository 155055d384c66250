"""How the worker's multiplexed call cuts a backlog of events into messages: by count and by an
upper bound of their bytes, so that no message passes the controller's receive limit (grpc's 4
MiB), which would end the call and every request on it. An event carries up to streamInterval
tokens of text, so a backlog of a large interval's events can be tens of MB."""

from __future__ import annotations

import pytest
from intentserve.v1 import worker_pb2
from intentserve.worker.engine.request import RequestOutput
from intentserve.worker.service import convert
from intentserve.worker.service.mux import MAX_EVENTS_PER_MESSAGE, MAX_MESSAGE_BYTES, pieces


def output(text: str, num_tokens: int, request_id: str = "req-" + "7" * 32) -> RequestOutput:
    return RequestOutput(request_id, (70000,) * num_tokens, text, False, None, 12, num_tokens)


def encoded(piece) -> worker_pb2.StreamEvents:
    message = worker_pb2.StreamEvents()
    for key, item in piece:
        event = message.events.add(stream=key)
        if isinstance(item, BaseException):
            event.error.details = str(item)
        else:
            convert.fill_generate_response(event.output, item, "w" * 64)
    return message


@pytest.mark.parametrize(
    ("text", "num_tokens", "count"),
    [
        ("é" * 100_000, 1000, 64),  # 200 KB of UTF-8 an event: a few a message
        ("x" * 2_000_000, 40_000, 3),  # each over the bound on its own: one a message
        ("ab", 1, 3000),  # small ones: the count cuts them
    ],
)
def test_every_piece_fits_and_nothing_is_lost_or_reordered(text, num_tokens, count):
    batch = [(key, output(text, num_tokens)) for key in range(count)]
    batch.insert(1, (9999, RuntimeError("d" * 1024)))
    cut = list(pieces(batch))
    assert [pair for piece in cut for pair in piece] == batch
    for piece in cut:
        assert 1 <= len(piece) <= MAX_EVENTS_PER_MESSAGE
        if len(piece) > 1:
            assert encoded(piece).ByteSize() <= MAX_MESSAGE_BYTES
    assert all(encoded(piece).ByteSize() < 4 << 20 for piece in cut)


def test_a_steps_events_of_the_default_interval_stay_one_message():
    batch = [(key, output(" word", 1)) for key in range(64)]
    assert len(list(pieces(batch))) == 1
