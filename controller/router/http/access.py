"""Around every HTTP request: its request id, one access-log line, and the count of requests
refused before routing.

The request id is the client's `X-Request-Id` when it sends one (checked as gRPC's are: at most
256 printable characters; else 400), or a new one; it is echoed in the response's
`X-Request-Id`, becomes the routed request's id (so the controller's and the worker's logs name
the request by it), and ends the completion's `id`.

The access log (logger `intentserve.access`, level info) has one line per request when it ends
(a stream: at its last event): method, route (the matched path template), status, latency_s and
request_id, as structured fields for `--log-format json`. A request refused before it is routed
(a bad body 400, no key 401, an unknown model or path 404, a wrong method 405, too large 413)
is counted in `intentserve_http_requests_refused_total{route,status}`.

A plain ASGI middleware: it sees the response's start and end without wrapping the body, so
streams pass through it as they are, and `request.receive()` still tells a disconnect.
"""

from __future__ import annotations

import logging
import time

from intentserve.common.ids import new_request_id, request_id_problem
from intentserve.controller.router.http.error_shapes import error_response
from intentserve.controller.router.http.errors import OpenAIError
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("intentserve.access")
HEADER = b"x-request-id"
UNMATCHED = "unmatched"  # the route label of a path no route serves (no label per path)
CLIENT_CLOSED = 499  # the status logged when the client went away before any response


def request_id_of(scope: Scope) -> str:
    """The id `AccessLog` gave the request."""
    return scope["state"]["request_id"]


def mark_routed(scope: Scope) -> None:
    """Called as the request is handed to the router: a later error is the routing's, not a
    refusal before it."""
    scope["state"]["routed"] = True


def refused_requests(registry: CollectorRegistry) -> Counter:
    return Counter(
        "intentserve_http_requests_refused",
        "HTTP requests refused before routing (bad body, no key, unknown model or path, "
        "wrong method, too large), by route and status",
        ("route", "status"),
        registry=registry,
    )


class AccessLog:
    """`app.add_middleware(AccessLog, refused=refused_requests(registry))`"""

    def __init__(self, app: ASGIApp, refused: Counter) -> None:
        self.app = app
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        given = dict(scope["headers"]).get(HEADER, b"").decode("latin-1")
        problem = request_id_problem(given) if given else None
        request_id = new_request_id() if problem is not None or not given else given
        scope.setdefault("state", {}).update(request_id=request_id, routed=False)
        status = CLIENT_CLOSED

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (HEADER, request_id.encode())]
            await send(message)

        try:
            if problem is not None:
                error = OpenAIError(400, f"X-Request-Id header: {problem}", param="X-Request-Id")
                await error_response(error, scope["path"])(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            self._done(scope, status, time.perf_counter() - started_s, request_id)

    def _done(self, scope: Scope, status: int, latency_s: float, request_id: str) -> None:
        route = getattr(scope.get("route"), "path", UNMATCHED)
        if status >= 400 and not scope["state"]["routed"] and status != CLIENT_CLOSED:
            self.refused.labels(route, str(status)).inc()
        fields = {
            "method": scope["method"],
            "route": route,
            "status": status,
            "latency_s": round(latency_s, 6),
            "request_id": request_id,
        }
        log.info(
            "%s %s %d %.1f ms %s",
            scope["method"],
            route,
            status,
            latency_s * 1e3,
            request_id,
            extra={"fields": fields},
        )
