"""Cross-origin requests to the HTTP API, for browser applications: off unless the operator names
the origins (`spec.controller.http.corsOrigins`). Each is a scheme and host (and port) as a
browser sends it, `https://app.example`, or `*` for any origin; no credentials are allowed
cross-origin (API keys travel in the `Authorization` header the browser is allowed to send).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware


def origin_problem(origin: str) -> str | None:
    """Why `origin` is not one a browser sends (None when it is)."""
    if origin == "*":
        return None
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{origin!r} is not an origin; allowed: '*' or scheme://host[:port] (http, https)"
    if origin != f"{parts.scheme}://{parts.netloc}" or parts.username or parts.password:
        return f"{origin!r} has more than scheme://host[:port]; an origin has no path or user"
    return None


def check_origins(origins: Sequence[str]) -> tuple[str, ...]:
    """The origins, or ValueError naming the first that is not one (a pydantic validator's)."""
    for origin in origins:
        problem = origin_problem(origin)
        if problem is not None:
            raise ValueError(problem)
    return tuple(origins)


def allow_origins(app: FastAPI, origins: Sequence[str]) -> None:
    """Answer preflights and mark responses for `origins`; nothing when there are none."""
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
            allow_credentials=False,
        )
