"""Which event loop the controller's and a router's grpc.aio servers run on, and why.

uvloop where it imports (a dependency on every platform it supports: less CPU per forwarded
token, docs/scale.md runs 8 and 9), asyncio's own loop elsewhere. `INTENTSERVE_EVENT_LOOP`
chooses: `auto` (the default, as above), `uvloop` (an error where it does not import, never a
quiet fallback) or `asyncio` (an operator's way to turn uvloop off). The HTTP API's server
(uvicorn) runs on the same kind of loop.
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

from intentserve.policy import IntentError
from intentserve.policy.modes import allowed_values, lookup_choice
from prometheus_client import CollectorRegistry, Info

EVENT_LOOP_ENV = "INTENTSERVE_EVENT_LOOP"


class LoopChoice(enum.Enum):
    """What the operator asks for."""

    AUTO = "auto"  # uvloop where it imports, else asyncio's
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


class LoopKind(enum.Enum):
    """What runs."""

    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


@dataclass(frozen=True)
class EventLoopChoice:
    kind: LoopKind
    why: str  # one line for the log: what was asked, and what decided it

    def new_loop(self) -> asyncio.AbstractEventLoop:
        if self.kind is LoopKind.UVLOOP:
            import uvloop

            return uvloop.new_event_loop()
        # NOTE: asyncio's own loop even where a process set another loop policy (uvloop's).
        return asyncio.DefaultEventLoopPolicy().new_event_loop()


def choose_event_loop(environ: Mapping[str, str] = os.environ) -> EventLoopChoice:
    """The loop INTENTSERVE_EVENT_LOOP asks for (unset or blank: auto); IntentError naming it
    for a word it does not know, or for `uvloop` where uvloop does not import."""
    value = environ.get(EVENT_LOOP_ENV, "").strip() or LoopChoice.AUTO.value
    choice = lookup_choice(LoopChoice, value)
    if choice is None:
        allowed = allowed_values(LoopChoice)
        raise IntentError(EVENT_LOOP_ENV, f"invalid value {value!r}; allowed values are {allowed}")
    asked = f"{EVENT_LOOP_ENV}={choice.value}"
    if choice is LoopChoice.ASYNCIO:
        return EventLoopChoice(LoopKind.ASYNCIO, f"asyncio ({asked})")
    failure = _uvloop_failure()
    if failure is None:
        return EventLoopChoice(LoopKind.UVLOOP, f"uvloop ({asked})")
    if choice is LoopChoice.UVLOOP:
        raise IntentError(
            EVENT_LOOP_ENV, f"uvloop was asked for, but it does not import: {failure}"
        )
    return EventLoopChoice(
        LoopKind.ASYNCIO, f"asyncio ({asked}; uvloop does not import: {failure})"
    )


def _uvloop_failure() -> str | None:
    """Why uvloop does not import here; None when it does."""
    try:
        import uvloop  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def register_loop_info(registry: CollectorRegistry, kind: LoopKind) -> None:
    """`intentserve_event_loop_info{loop="uvloop"} 1` in the server's /metrics."""
    info = Info(
        "intentserve_event_loop",
        "The event loop the gRPC servers (and the HTTP API) run on",
        registry=registry,
    )
    info.info({"loop": kind.value})
