"""A normal stop with streams in flight on both front ends: each stream gets the grace, then ends
with the reason; the loops shut down in order, each closing the channels made on it while it
still runs, and nothing is logged as an error (no traceback in `up`'s output)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time

import grpc
import grpc.aio
import pytest
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy import examples

from tests.controller.conftest import FAST, Client, eventually
from tests.controller.scripted_worker import Behaviour, ScriptedWorker

pytestmark = pytest.mark.integration
GRACE_S = 0.5


@pytest.fixture
def aio_channels(monkeypatch):
    """Every grpc.aio channel the controller makes, with the loop it was made on and whether its
    close ran on that loop while the loop was running."""
    made: list[dict] = []
    real = grpc.aio.insecure_channel

    def recording(*args, **kwargs):
        channel = real(*args, **kwargs)
        entry = {"loop": asyncio.get_running_loop(), "closed_running": False}
        close = channel.close

        async def closing(grace=None):
            entry["closed_running"] = asyncio.get_running_loop() is entry["loop"]
            return await close(grace)

        channel.close = closing
        made.append(entry)
        return channel

    monkeypatch.setattr(grpc.aio, "insecure_channel", recording)
    return made


def _http_stream(port: int, out: dict) -> None:
    """A streamed completion over HTTP; `out` gets its events (or the error that ended it)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"model": "smollm2-135m", "prompt": "hi", "max_tokens": 8, "stream": True}
    try:
        connection.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        out["status"] = (response := connection.getresponse()).status
        out["body"] = response.read().decode()
    except Exception as error:  # noqa: BLE001 - the test reports what the client saw
        out["error"] = f"{type(error).__name__}: {error}"
    finally:
        connection.close()


def test_a_stop_ends_streams_in_flight_with_the_reason_and_logs_no_error(aio_channels, caplog):
    settings = ControllerSettings(**{**FAST, "paged_attention": "on", "http_port": 0})
    server = ControllerServer(settings.config()).start()
    worker = ScriptedWorker(server.address, "w0", examples.cpu(), behaviour=Behaviour.BLOCK)
    client = Client(server.address)
    try:
        assert worker.up().verified
        eventually(lambda: server.verdict().ready, what="READY")
        port = int(server.http_url.rsplit(":", 1)[1])
        seen: dict = {}
        outcome: dict = {}

        def grpc_stream() -> None:
            try:
                outcome["chunks"] = len(list(client.generate(max_tokens=8, timeout=30)))
            except grpc.RpcError as error:
                outcome["error"] = (error.code(), error.details())

        streams = [
            threading.Thread(target=grpc_stream),
            threading.Thread(target=_http_stream, args=(port, seen)),
        ]
        for stream in streams:
            stream.start()
        eventually(lambda: worker.num_requests == 2, what="both streams at the worker")
        caplog.set_level(logging.INFO)
        started_s = time.monotonic()
        server.stop(grace_s=GRACE_S)
        stop_s = time.monotonic() - started_s
        for stream in streams:
            stream.join(10)
    finally:
        client.channel.close()
        worker.stop()
        server.stop(grace_s=0)
    assert GRACE_S <= stop_s < GRACE_S + 3.0
    code, details = outcome["error"]
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "the controller is stopping" in details
    assert seen.get("status") == 200, seen
    assert "the controller is stopping" in seen["body"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]
    assert len(aio_channels) == 2  # one per loop: the gRPC server's and the HTTP server's
    assert all(c["closed_running"] for c in aio_channels)
