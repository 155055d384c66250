"""The HTTP API's deadlines and connection caps (controller/router/http/connection_limits.py), on
real sockets against a real HttpServer on loopback: a client that sends its request too slowly,
or sits idle, is closed; one over a cap is refused; a stream longer than every timeout runs to
its end. Timeouts are 0.5 s and each test waits WAIT_S for what it expects (no timed speed)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from intentserve.common.tls import TlsIdentity
from intentserve.controller.event_loop import EventLoopChoice, LoopKind, choose_event_loop
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.router.http.connection_limits import HttpLimits
from intentserve.controller.router.http.server import HttpServer
from intentserve.controller.router.server import RouterServer
from intentserve.controller.router.settings import RouterConfig
from prometheus_client import CollectorRegistry
from starlette.requests import ClientDisconnect

from tests.controller.conftest import eventually

pytestmark = pytest.mark.integration

SHORT_S = 0.5  # every timeout under test
# Past uvicorn's own keep-alive (5 s), which would close an idle connection without these limits.
WAIT_S = 4.0
SHORT = HttpLimits(header_timeout_s=SHORT_S, body_timeout_s=SHORT_S, keep_alive_timeout_s=SHORT_S)
STREAM_CHUNKS, STREAM_GAP_S = 10, 0.25  # 2.5 s: longer than every timeout, several times over
HEAD = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"


def toy_app() -> FastAPI:
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        try:
            return Response(await request.body())
        except ClientDisconnect:  # closed at the body timeout: no one to answer
            return Response(status_code=499)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def events():
            for i in range(STREAM_CHUNKS):
                await asyncio.sleep(STREAM_GAP_S)
                yield f"data: {i}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def identity() -> TlsIdentity:
    return DeploymentCa.create("limits").controller_identity(())  # 127.0.0.1 among its names


class Served:
    def __init__(self, server: HttpServer, registry: CollectorRegistry, tls: TlsIdentity | None):
        self.server, self.registry, self.tls = server, registry, tls

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.tls.ca_pem.decode())

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=WAIT_S)
        if self.tls is None:
            return sock
        return self.context().wrap_socket(sock, server_hostname="127.0.0.1")

    def http(self) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=WAIT_S)
        return http.client.HTTPSConnection(
            "127.0.0.1", self.server.port, timeout=WAIT_S, context=self.context()
        )

    def count(self, name: str, reason: str) -> float:
        return self.registry.get_sample_value(
            f"intentserve_http_connections_{name}_total", {"reason": reason}
        )

    def num_open(self) -> float:
        return self.registry.get_sample_value("intentserve_http_connections_open")


@contextlib.contextmanager
def serving(
    limits: HttpLimits = SHORT, tls: TlsIdentity | None = None, loop: EventLoopChoice | None = None
) -> Iterator[Served]:
    async def nothing() -> None:
        pass

    registry = CollectorRegistry()
    server = HttpServer(
        toy_app(),
        "127.0.0.1",
        0,
        tls,
        on_stopped=nothing,
        loop=loop or choose_event_loop({}),
        limits=limits,
        metrics=registry,
    )
    server.start()
    try:
        yield Served(server, registry, tls)
    finally:
        server.begin_stop(0)
        server.join()


def closed_within(sock: socket.socket, timeout_s: float = WAIT_S) -> bool:
    """Whether the server closes `sock` within `timeout_s` (what it sends before is read)."""
    deadline_s = time.monotonic() + timeout_s
    while (left_s := deadline_s - time.monotonic()) > 0:
        sock.settimeout(left_s)
        try:
            if not sock.recv(4096):
                return True
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            return True
    return False


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body (the server keeps the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        ).split(b":")[1]
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head


TLS_OR_NOT = pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout():
    with serving() as served, served.connect() as sock:
        assert closed_within(sock)
        eventually(lambda: served.count("closed", "header_timeout") == 1, what="the count")


@pytest.mark.parametrize("kind", list(LoopKind), ids=lambda k: k.value)
def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(kind):
    with serving(loop=EventLoopChoice(kind, "test")) as served, served.connect() as sock:
        sock.sendall(HEAD)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert closed_within(sock)
        eventually(lambda: served.count("closed", "keep_alive_timeout") == 1, what="the count")
        assert served.count("closed", "header_timeout") == 0


@TLS_OR_NOT
def test_a_head_sent_a_byte_at_a_time_is_closed_at_the_header_timeout(secure, identity):
    head = b"GET /ok HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 10_000
    with serving(tls=identity if secure else None) as served, served.connect() as sock:
        deadline_s = time.monotonic() + WAIT_S
        closed = False
        for byte in head:  # a byte every 0.1 s: the gaps are far below the timeout
            if time.monotonic() > deadline_s:
                break
            try:
                sock.sendall(bytes([byte]))
            except (ConnectionError, ssl.SSLError):
                closed = True
                break
            if closed_within(sock, 0.1):
                closed = True
                break
        assert closed, "the server still holds a connection sending its head a byte at a time"
        eventually(lambda: served.count("closed", "header_timeout") == 1, what="the count")


def test_a_body_that_stops_arriving_is_closed_at_the_body_timeout():
    with serving() as served, served.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        assert closed_within(sock)
        eventually(lambda: served.count("closed", "body_timeout") == 1, what="the count")


def test_a_body_in_time_is_read_and_answered():
    with serving() as served:
        connection = served.http()
        connection.request("POST", "/echo", body=b"hello")
        assert connection.getresponse().read() == b"hello"
        connection.close()


@TLS_OR_NOT
def test_a_stream_longer_than_every_timeout_runs_to_its_end(secure, identity):
    with serving(tls=identity if secure else None) as served:
        connection = served.http()
        connection.request("GET", "/stream")
        response = connection.getresponse()
        assert response.status == 200
        events = response.read().decode().split("\n\n")
        assert events[:-1] == [f"data: {i}" for i in range(STREAM_CHUNKS)]
        connection.close()
        assert sum(served.count("closed", r) for r in ("header_timeout", "body_timeout")) == 0


@pytest.mark.parametrize(
    ("limits", "status", "reason"),
    [
        (
            HttpLimits(keep_alive_timeout_s=60, max_connections_per_client=3),
            429,
            "max_connections_per_client",
        ),
        (HttpLimits(keep_alive_timeout_s=60, max_connections=3), 503, "max_connections"),
    ],
)
def test_a_connection_over_a_cap_is_refused_while_the_others_are_open(limits, status, reason):
    with serving(limits) as served, contextlib.ExitStack() as stack:
        held = [stack.enter_context(served.connect()) for _ in range(3)]
        for sock in held:
            sock.sendall(HEAD)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        with served.connect() as over:
            over.settimeout(WAIT_S)
            with contextlib.suppress(ConnectionError):
                answer = over.recv(4096)
                assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer
            assert closed_within(over)
        eventually(lambda: served.count("refused", reason) == 1, what="the count")
        assert served.num_open() == 3
        held.pop().close()
        eventually(lambda: served.num_open() == 2, what="the closed one released")
        with served.connect() as again:
            again.sendall(HEAD)
            assert read_response(again).startswith(b"HTTP/1.1 200")


def assert_served_under_short_limits(http_url: str) -> None:
    """A silent connection is closed at the header timeout, and /metrics counts it."""
    port = urllib.parse.urlsplit(http_url).port
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        assert closed_within(sock)
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    assert 'intentserve_http_connections_closed_total{reason="header_timeout"} 1.0' in text
    assert "intentserve_http_connections_open 1.0" in text  # the scrape's own


def test_the_controllers_settings_reach_its_http_api_and_its_metrics(start_controller):
    server, _ = start_controller(http_port=0, http_header_timeout_s=SHORT_S)
    assert_served_under_short_limits(server.http_url)


def test_a_separate_routers_config_reaches_its_http_api_and_its_metrics():
    config = RouterConfig("limits", controller="nowhere:1", port=0, http_port=0, http_limits=SHORT)
    with RouterServer(config, watch=False) as router:
        assert_served_under_short_limits(router.http_url)
