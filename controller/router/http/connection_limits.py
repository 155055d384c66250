"""How long the HTTP API waits on a client, and how many connections clients may hold: the
frozen `HttpLimits` every HTTP server (the controller's, a separate router's) runs with.

A client is given a deadline for each part of a request it sends, and none for what it receives:

- `header_timeout_s`: from the connection's opening, or from the first byte of each next request
  on a kept-alive connection, to the end of the request's head. 10 s: a head is a few KB, sent
  in well under a second by any client that is online; 10 s still allows a slow mobile link and
  a few lost packets. A deadline, not a gap between bytes: a client that sends its head a byte
  at a time (slowloris) holds the connection 10 s, however often it sends.
- `body_timeout_s`: from the end of the head to the body's last byte. 30 s: the largest body read
  (app.MAX_BODY_BYTES, 8 MiB) arrives in that time at 280 KB/s; a chat request of a few KB
  arrives in milliseconds. A deadline too, so that a body that trickles cannot extend it.
- `keep_alive_timeout_s`: how long a connection may sit idle between requests. 5 s: uvicorn's own
  default, and Node's; a client that reuses its connections does so within a burst, and an idle
  one costs the server a descriptor and a slot below `max_connections`.

Both deadlines count the client's time only: while the server itself has stopped reading
(flow control: the app has not yet taken what came, or pipelined requests wait for the one being
answered), the deadline starts again. Nothing times a response: a stream of a long generation
runs as long as it runs.

- `max_connections_per_client`: connections one address may hold at once. 256: a load
  generator at the concurrency of docs/benchmarks.md (64 streams) with its side calls beside
  it (64 was the first default, and the issue's own run of 64 streams and a bad request from
  one host had its 65th connection refused), far more than a browser (6 per origin) sends; one
  address cannot take more than a quarter of `max_connections`. Behind a proxy, or for an
  application server that fans many users into one address, raise it: every connection of
  theirs is one client's.
- `max_connections`: connections held at once in all. 1024: bounded memory and descriptors (a
  host's usual `ulimit -n` is 1024, a container's far more: raise both together).

- `responses_store_size`: the Responses API's responses kept per API key, for
  `previous_response_id` and `GET /v1/responses/{id}` (256; why: responses_store.py).

- `anthropic_betas_ignored`: `anthropic-beta` names the Messages API takes without doing what
  they ask, each said back in the reply's `x-intentserve-betas-ignored` header (none by default:
  an unknown beta is refused naming the header; anthropic_routes.py).

A connection over a cap is answered at once (429 for one client's cap, 503 for the total, the
message naming the setting) and closed; one past a deadline is closed. Each is counted in
`/metrics`: `intentserve_http_connections_closed_total{reason}` and
`intentserve_http_connections_refused_total{reason}`, with the connections open in
`intentserve_http_connections_open`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from intentserve.controller.router.http.responses_store import DEFAULT_RESPONSES_STORE_SIZE

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256
DEFAULT_MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE
    anthropic_betas_ignored: tuple[str, ...] = ()


class Closed(enum.Enum):
    """Why the server closed a connection it had admitted."""

    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"
    KEEP_ALIVE_TIMEOUT = "keep_alive_timeout"


class Refused(enum.Enum):
    """Why the server refused a connection as it opened: the cap it was over."""

    MAX_CONNECTIONS_PER_CLIENT = "max_connections_per_client"
    MAX_CONNECTIONS = "max_connections"
