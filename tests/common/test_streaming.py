"""The channel options of the callers that read token streams: each message is read on the thread
that iterates the call (no hand-over from the channel's polling thread), and another thread can
still end the call with `cancel()` (the controller does so when a worker is lost)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from intentserve.common.streaming import STREAM_READER_OPTIONS

METHOD = "/test.Streams/Count"


@pytest.fixture
def address():
    release = threading.Event()

    def count(request: bytes, context):
        for i in range(3):
            yield str(i).encode()
        if request == b"hold":  # a stream that runs until its caller cancels it
            release.wait(10)

    handler = grpc.method_handlers_generic_handler(
        "test.Streams", {"Count": grpc.unary_stream_rpc_method_handler(count)}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(4, thread_name_prefix="server"), handlers=[handler]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    release.set()
    server.stop(0)


def _client_threads() -> set[threading.Thread]:
    """Threads besides the server's (its pool and its `_serve` poller)."""
    return {t for t in threading.enumerate() if not t.name.startswith("server")} - {
        t for t in threading.enumerate() if t.name.endswith("(_serve)")
    }


@pytest.mark.parametrize(("options", "polled"), [((), True), (STREAM_READER_OPTIONS, False)])
def test_a_stream_is_read_on_the_thread_that_iterates_it(address, options, polled):
    before = _client_threads()
    with grpc.insecure_channel(address, options=options) as channel:
        call = channel.unary_stream(METHOD)(b"", timeout=10)
        assert next(call) == b"0"
        # grpc's default polls the call's events on a thread of its own
        assert bool(_client_threads() - before) is polled
        assert list(call) == [b"1", b"2"]


def test_another_thread_ends_a_stream_it_reads_with_cancel(address):
    with grpc.insecure_channel(address, options=STREAM_READER_OPTIONS) as channel:
        call = channel.unary_stream(METHOD)(b"hold", timeout=10)
        assert [next(call) for _ in range(3)] == [b"0", b"1", b"2"]
        threading.Timer(0.2, call.cancel).start()
        with pytest.raises(grpc.RpcError) as error:
            next(call)
        assert error.value.code() is grpc.StatusCode.CANCELLED
