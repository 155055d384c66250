"""Who may call what on the controller.

- WorkerRegistry: only the deployment's own workers, each as itself. The client certificate's
  common name must be a worker id the desired state expects (`<name>-<i>`, i < replicas) and the
  request's `worker_id`. No certificate: UNAUTHENTICATED; another identity: PERMISSION_DENIED.
- WorkerTable (the routers' watch): a router, by a certificate of the deployment's CA whose
  common name is `router` and whose name is this deployment's (`router.<deployment>.intentserve`:
  a CA shared between deployments lets no other deployment's router watch), or by the admin
  token. A worker's certificate, the controller's or another deployment's router's is
  PERMISSION_DENIED, naming it; a client's API key, or nothing, is UNAUTHENTICATED.
- Admin: operators, with a bearer token in the call metadata (`authorization: Bearer <token>`).
  Status and Explain need it too: they show every worker's address and realized state.
- Inference: open, or, when API keys are set, a valid key (or the admin token) as a bearer token;
  the HTTP API asks `Security.admits_client` the same question.
- Health and reflection stay open: load balancers and probes need them.

Refusals are logged with the peer's address. With `tls` None (an explicit insecure choice) there
is no worker identity to check; tokens and keys still apply when set.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
from intentserve.common.status import write_all
from intentserve.common.tls import (
    ROUTER,
    TlsIdentity,
    foreign_peer,
    peer_common_name,
    server_name,
)

log = logging.getLogger(__name__)

REGISTRY = "/intentserve.v1.WorkerRegistry/"
ADMIN = "/intentserve.v1.Admin/"
INFERENCE = "/intentserve.v1.Inference/"
TABLE = "/intentserve.v1.WorkerTable/"


class SecurityError(ValueError):
    """A secret or certificate file cannot be used; the message names the field and file."""


def read_secret_lines(path: str, field: str) -> frozenset[str]:
    """Non-empty, non-comment lines of a secret file (one token or key per line)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SecurityError(f"{field} {path}: {error.strerror or error}") from None
    values = frozenset(s for line in lines if (s := line.strip()) and not s.startswith("#"))
    if not values:
        raise SecurityError(f"{field} {path}: holds no value (one per line)")
    return values


@dataclass(frozen=True)
class Security:
    tls: TlsIdentity | None = None  # None: plaintext and no worker identity (insecure)
    admin_tokens: frozenset[str] = frozenset()  # empty: Admin is open (insecure test setups)
    api_keys: frozenset[str] = frozenset()  # empty: Inference is open

    @property
    def insecure(self) -> bool:
        return self.tls is None

    def admits_client(self, token: str | None) -> bool:
        """Whether an inference call (gRPC or HTTP) with this bearer token may go on: always
        when no API keys are set; else with a key, or an admin token."""
        return not self.api_keys or _matches(token, self.api_keys | self.admin_tokens)


def bearer(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key == "authorization" and value.startswith("Bearer "):
            return value.removeprefix("Bearer ")
    return None


def _matches(token: str | None, accepted: frozenset[str]) -> bool:
    # NOTE: compare_digest against every accepted value: no early exit that times the match.
    found = False
    for candidate in accepted:
        found |= token is not None and hmac.compare_digest(token.encode(), candidate.encode())
    return found


Refusal = tuple[grpc.StatusCode, str] | None


class _Rules:
    """Which check a method gets, and the checks."""

    def __init__(
        self, security: Security, deployment: str, worker_ids: Callable[[], frozenset[str]]
    ) -> None:
        self._security = security
        self._deployment = deployment
        self._worker_ids = worker_ids

    def _check_for(self, method: str) -> Callable | None:
        if method.startswith(REGISTRY) and self._security.tls is not None:
            return self._worker
        if method.startswith(TABLE) and (self._security.tls or self._security.admin_tokens):
            return self._router
        if method.startswith(ADMIN) and self._security.admin_tokens:
            return self._admin
        if method.startswith(INFERENCE) and self._security.api_keys:
            return self._client
        return None

    def _worker(self, request, context: grpc.ServicerContext) -> Refusal:
        name = peer_common_name(context)
        if name is None:
            return grpc.StatusCode.UNAUTHENTICATED, "a worker must present its certificate"
        if name not in self._worker_ids():
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"{name!r} is not a worker of this deployment",
            )
        if request.worker_id != name:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of {name!r} cannot speak for worker {request.worker_id[:64]!r}",
            )
        return None

    def _router(self, request, context: grpc.ServicerContext) -> Refusal:
        name = peer_common_name(context) if self._security.tls is not None else None
        if name == ROUTER and (foreign := foreign_peer(context, name, self._deployment)):
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"{foreign}: only a router of this deployment (a certificate of its CA named "
                f"{server_name(self._deployment, ROUTER)}) or an operator may watch the worker "
                "table",
            )
        if name == ROUTER or _matches(bearer(context), self._security.admin_tokens):
            return None
        if name is not None:
            role = "a worker" if name in self._worker_ids() else "not a router"
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of {name!r} is {role}: only a router (a certificate of the "
                f"deployment's CA named {ROUTER!r}) or an operator may watch the worker table",
            )
        key = " (an API key is a client's, not a router's)" if bearer(context) else ""
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            f"watching the worker table needs a router certificate (common name {ROUTER!r}, "
            f"from the deployment's CA) or the admin token{key}",
        )

    def _admin(self, request, context: grpc.ServicerContext) -> Refusal:
        if _matches(bearer(context), self._security.admin_tokens):
            return None
        return grpc.StatusCode.UNAUTHENTICATED, "an admin token is required"

    def _client(self, request, context: grpc.ServicerContext) -> Refusal:
        if self._security.admits_client(bearer(context)):
            return None
        return grpc.StatusCode.UNAUTHENTICATED, "a valid API key is required"


class AuthInterceptor(_Rules, grpc.aio.ServerInterceptor):
    """On the controller's grpc.aio server: handlers are coroutines, `context.abort` is awaited."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        check = self._check_for(method)
        if handler is None or check is None:
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_aguard_unary(handler.unary_unary, check, method))
        if handler.unary_stream is not None:
            return handler._replace(
                unary_stream=_aguard_stream(handler.unary_stream, check, method)
            )
        if handler.stream_stream is not None and method.startswith(INFERENCE):
            return handler._replace(
                stream_stream=_aguard_bidi(handler.stream_stream, check, method)
            )
        # NOTE: fail closed: a kind of call no guard above understands is refused, never let by.
        return _refuse_all(handler, method)


def _refuse_all(handler, method: str):
    refusal = grpc.StatusCode.PERMISSION_DENIED, "this call is not served to anyone"

    async def refused(request, context):
        await _arefuse(context, refusal, method)

    kind = next(k for k in ("stream_unary", "stream_stream") if getattr(handler, k) is not None)
    return handler._replace(**{kind: refused})


def _log_refusal(context, refusal: tuple[grpc.StatusCode, str], method: str) -> None:
    code, message = refusal
    log.warning("refused %s from %s: %s: %s", method, context.peer(), code.name, message)


async def _arefuse(context: grpc.aio.ServicerContext, refusal, method: str) -> None:
    _log_refusal(context, refusal, method)
    await context.abort(*refusal)  # raises: the handler never runs


def _aguard_unary(behavior, check, method: str):
    async def guarded(request, context):
        refusal = check(request, context)
        if refusal is not None:
            await _arefuse(context, refusal, method)
        return await behavior(request, context)

    return guarded


def _aguard_stream(behavior, check, method: str):
    async def guarded(request, context):
        refusal = check(request, context)
        if refusal is not None:
            await _arefuse(context, refusal, method)
        await write_all(behavior(request, context), context)

    return guarded


def _aguard_bidi(behavior, check, method: str):
    """A request stream: the check reads the call's metadata only (an inference key), before
    the first request is read."""

    async def guarded(requests, context):
        refusal = check(None, context)
        if refusal is not None:
            await _arefuse(context, refusal, method)
        await write_all(behavior(requests, context), context)

    return guarded
