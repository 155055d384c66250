"""Where `HttpLimits` (connection_limits.py) act: `ConnectionGuard`, one per HTTP server, counts
the connections open by client address and in all and meters what it closes and refuses;
`GuardedHttpProtocol`, uvicorn's httptools protocol with a deadline on each request's head and
body, handed to uvicorn as its `http` protocol.

The deadlines act on the transport, so they hold for TLS connections as for plaintext ones
(a TLS connection is counted once its handshake is done; asyncio bounds the handshake at 60 s).
A connection past a deadline, or idle past keep-alive, is aborted: it is owed nothing, and with
TLS a graceful close would wait for its peer's reply up to 30 s more.

    guard = ConnectionGuard(limits, registry)
    uvicorn.Config(app, http=guard.protocol, timeout_keep_alive=limits.keep_alive_timeout_s)
"""

from __future__ import annotations

import collections
import enum
import functools
import json
from asyncio import TimerHandle, Transport

from intentserve.controller.router.http.connection_limits import Closed, HttpLimits, Refused
from intentserve.controller.router.http.errors import OpenAIError
from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

STATUS = {Refused.MAX_CONNECTIONS_PER_CLIENT: 429, Refused.MAX_CONNECTIONS: 503}
PHRASE = {429: "Too Many Requests", 503: "Service Unavailable"}


class ConnectionGuard:
    def __init__(self, limits: HttpLimits, registry: CollectorRegistry) -> None:
        self.limits = limits
        self._num_open = 0
        self._num_by_client: collections.Counter[str] = collections.Counter()
        self._closed = Counter(
            "intentserve_http_connections_closed",
            "HTTP connections the server closed: a request's head or body past its deadline, "
            "or idle past keep-alive",
            ("reason",),
            registry=registry,
        )
        self._refused = Counter(
            "intentserve_http_connections_refused",
            "HTTP connections refused as they opened, by the cap they were over",
            ("reason",),
            registry=registry,
        )
        for closed in Closed:  # NOTE: every reason is exported from the start, at 0
            self._closed.labels(closed.value)
        for refused in Refused:
            self._refused.labels(refused.value)
        Gauge(
            "intentserve_http_connections_open",
            "HTTP connections open (admitted, not yet closed)",
            registry=registry,
        ).set_function(lambda: self._num_open)
        self._refusals = {reason: _refusal(reason, limits) for reason in Refused}
        self.protocol = functools.partial(GuardedHttpProtocol, guard=self)

    def admit(self, client: str) -> bytes | None:
        """Count a connection from `client` in, or refuse it: the response to send it before
        closing it (and the refusal is counted)."""
        if self._num_by_client[client] >= self.limits.max_connections_per_client:
            reason = Refused.MAX_CONNECTIONS_PER_CLIENT
        elif self._num_open >= self.limits.max_connections:
            reason = Refused.MAX_CONNECTIONS
        else:
            self._num_by_client[client] += 1
            self._num_open += 1
            return None
        self._refused.labels(reason.value).inc()
        return self._refusals[reason]

    def release(self, client: str) -> None:
        """An admitted connection from `client` has closed."""
        self._num_open -= 1
        self._num_by_client[client] -= 1
        if not self._num_by_client[client]:
            del self._num_by_client[client]

    def closed(self, reason: Closed) -> None:
        self._closed.labels(reason.value).inc()


def _refusal(reason: Refused, limits: HttpLimits) -> bytes:
    """The whole response a connection refused for `reason` is sent (OpenAI's error shape)."""
    status = STATUS[reason]
    if reason is Refused.MAX_CONNECTIONS_PER_CLIENT:
        message = (
            f"this address holds {limits.max_connections_per_client} connections, the most "
            "one client may (maxConnectionsPerClient)"
        )
    else:
        message = (
            f"the server holds {limits.max_connections} connections, the most it may "
            "(maxConnections)"
        )
    body = json.dumps(OpenAIError(status, message, code=reason.value).body()).encode()
    head = (
        f"HTTP/1.1 {status} {PHRASE[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class Reading(enum.Enum):
    HEAD = "head"
    BODY = "body"


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, and the guard's deadlines and caps. NOTE: at most one
    deadline is armed, while a request's head or body is being read (`_reading`)."""

    def __init__(self, *args, guard: ConnectionGuard, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._admitted_client: str | None = None  # None: not admitted (refused, or not yet)
        self._reading: Reading | None = None
        self._deadline: TimerHandle | None = None

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client[0] if self.client else ""
        refusal = self._guard.admit(client)
        if refusal is not None:
            transport.write(refusal)
            transport.abort()
            return
        self._admitted_client = client
        self._read(Reading.HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading()
        if self._admitted_client is not None:
            self._guard.release(self._admitted_client)
            self._admitted_client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted_client is None:
            return
        if self._reading is None:  # between requests: these bytes begin the next one's head
            self._read(Reading.HEAD)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._read(Reading.BODY)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._stop_reading()
        super().on_message_complete()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self._guard.closed(Closed.KEEP_ALIVE_TIMEOUT)
            self.transport.abort()

    def _read(self, reading: Reading) -> None:
        self._stop_reading()
        self._reading = reading
        limits = self._guard.limits
        timeout_s = limits.header_timeout_s if reading is Reading.HEAD else limits.body_timeout_s
        self._deadline = self.loop.call_later(timeout_s, self._past_deadline)

    def _stop_reading(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._reading = self._deadline = None

    def _past_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server's wait, not the client's: it starts again
            self._read(self._reading)
            return
        self._guard.closed(
            Closed.HEADER_TIMEOUT if self._reading is Reading.HEAD else Closed.BODY_TIMEOUT
        )
        self.transport.abort()
