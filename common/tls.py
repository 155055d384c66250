"""Mutual TLS between a deployment's controller, its routers and its workers, as all sides use it.

Every certificate of a deployment is issued by the deployment's own CA; its common name is who
holds it: `controller`, `router` (the role every router holds), or the worker id (`local-0`).
Servers are reached by a fixed name, not by whatever address they were dialled at, so
certificates need not list every address a cluster may give a pod: the controller is
`controller.<deployment>.intentserve`, a worker `<worker_id>.<deployment>.intentserve`. A peer
is checked by both: its common name says who (a role, for the controller and routers), that name
of whose deployment (`foreign_peer`), so a CA that deployments share lets none call another's.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

CONTROLLER = "controller"  # the common name of the controller's certificate
ROUTER = "router"  # the common name of every router's certificate (a role: routers share it)
DOMAIN = "intentserve"


@dataclass(frozen=True)
class TlsIdentity:
    """One party's certificate chain and key, and the CA it trusts (PEM bytes)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def to_dict(self) -> dict[str, str]:
        """Plain data, to cross into a Ray actor (each actor gets only its own identity)."""
        return {k: v.decode() for k, v in vars(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> TlsIdentity:
        return cls(*(data[k].encode() for k in ("ca_pem", "cert_pem", "key_pem")))


def server_name(deployment: str, holder: str) -> str:
    """The name a server's certificate is checked against: `<holder>.<deployment>.intentserve`."""
    return f"{holder}.{deployment}.{DOMAIN}"


def server_credentials(identity: TlsIdentity, *, require_client_auth: bool):
    """A TLS server; with `require_client_auth`, only peers with a certificate of the CA."""
    return grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)],
        root_certificates=identity.ca_pem,
        require_client_auth=require_client_auth,
    )


def secure_channel(address: str, identity: TlsIdentity, name: str, options=()) -> grpc.Channel:
    """A channel that verifies the server as `name` and presents `identity` as the client."""
    return grpc.secure_channel(
        address, _client_credentials(identity), options=_named(name, options)
    )


def secure_aio_channel(
    address: str, identity: TlsIdentity, name: str, options=()
) -> grpc.aio.Channel:
    """`secure_channel` for an event loop (make it on the loop that uses it)."""
    return grpc.aio.secure_channel(
        address, _client_credentials(identity), options=_named(name, options)
    )


def _client_credentials(identity: TlsIdentity) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=identity.ca_pem,
        private_key=identity.key_pem,
        certificate_chain=identity.cert_pem,
    )


def _named(name: str, options) -> list:
    return [("grpc.ssl_target_name_override", name), *options]


def peer_common_name(context: grpc.ServicerContext) -> str | None:
    """The common name of the peer's verified client certificate; None without one."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode() if names else None


def peer_deployments(context: grpc.ServicerContext, holder: str) -> tuple[str, ...]:
    """The deployments whose `holder` the peer's verified certificate names it: its DNS names
    `<holder>.<deployment>.intentserve` (`server_name`)."""
    prefix, suffix = f"{holder}.", f".{DOMAIN}"
    names = (n.decode() for n in context.auth_context().get("peer_dns") or [])
    found = {
        n[len(prefix) : -len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)
    }
    return tuple(sorted(d for d in found if d and "." not in d))  # a deployment is a DNS label


def foreign_peer(context: grpc.ServicerContext, holder: str, deployment: str) -> str | None:
    """Why the peer, whose certificate's common name is `holder`, is not `deployment`'s, or None
    when it is. NOTE: the common name is a role (`router`, `controller`) every deployment has;
    its name says whose, so that a CA shared between deployments lets no certificate cross."""
    found = peer_deployments(context, holder)
    if deployment in found:
        return None
    whose = f"deployment {', '.join(map(repr, found))}" if found else "no deployment"
    return f"the certificate of {holder!r} is of {whose}, not of {deployment!r}"


class PeerGate(grpc.ServerInterceptor):
    """Lets through only peers whose verified certificate names one of `allowed`, of
    `deployment`, on the project's own services (`/intentserve.`); health and reflection stay
    as they are. A worker's server uses it so that only its controller and routers reach it."""

    def __init__(
        self, allowed: frozenset[str], deployment: str, prefix: str = "/intentserve."
    ) -> None:
        self._allowed = allowed
        self._deployment = deployment
        self._prefix = prefix

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefix):
            return handler
        allowed, deployment = self._allowed, self._deployment

        def check(context: grpc.ServicerContext) -> None:
            name = peer_common_name(context)
            if name not in allowed:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"only {', '.join(sorted(allowed))} may call this server",
                )
            if (foreign := foreign_peer(context, name, deployment)) is not None:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, foreign)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request, context):
                check(context)
                return inner(request, context)

            return handler._replace(unary_unary=unary)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request, context):
                check(context)
                yield from inner_stream(request, context)

            return handler._replace(unary_stream=stream)
        if handler.stream_stream is not None:
            inner_bidi = handler.stream_stream

            def bidi(request_iterator, context):
                check(context)
                yield from inner_bidi(request_iterator, context)

            return handler._replace(stream_stream=bidi)
        # NOTE: a kind of method not handled above is refused rather than let through.
        inner_any = handler.stream_unary

        def refuse(request_iterator, context):
            check(context)
            return inner_any(request_iterator, context)

        return handler._replace(stream_unary=refuse)
