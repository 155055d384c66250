"""What a separate router runs with (`intentserve router`, or a test): the frozen `RouterConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.controller.auth import Security
from intentserve.controller.router.admission import DEFAULT_QUEUE_LIMITS, QueueLimits
from intentserve.controller.router.http.connection_limits import HttpLimits
from intentserve.controller.router.watched import DEFAULT_MAX_STALE_S

DEFAULT_ROUTER_PORT = 50061


@dataclass(frozen=True)
class RouterConfig:
    deployment: str
    controller: str  # host:port of the controller's WorkerTable (with TLS: its registry port)
    # `tls`: the router's own certificate (common name `router`), presented to the controller
    # and to the workers, and served to clients; `api_keys`: what clients must present (none:
    # inference is open); `admin_tokens`: the first is presented to the controller where there
    # is no TLS, and any of them opens `status` here.
    security: Security = Security()  # the default, no TLS and no tokens, is for tests only
    host: str = "127.0.0.1"
    port: int = DEFAULT_ROUTER_PORT  # 0 picks a free port
    # The OpenAI-compatible HTTP API, /health and /metrics (HTTPS with the router's certificate
    # when `security.tls` is set); None: none. 0 picks a free port.
    http_port: int | None = None
    http_limits: HttpLimits = HttpLimits()  # its deadlines and connection caps
    max_stale_s: float = DEFAULT_MAX_STALE_S  # serve a table the controller is silent on this long
    model: str = ""  # the served model's name, for the request metrics' labels
    router_id: str = "router"  # for the controller's log
    max_outstanding_per_worker: int | None = None
    admission: QueueLimits = DEFAULT_QUEUE_LIMITS
    tick_s: float = 0.1  # how often health and the log follow the table's freshness
