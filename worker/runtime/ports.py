"""Network helpers: a port held before the server that will use it exists, and the local address
on the route to a peer."""

from __future__ import annotations

import contextlib
import socket

ANY_HOSTS = ("0.0.0.0", "::", "[::]")


class PortReservation:
    """A port bound now (SO_REUSEPORT, never listening) for a gRPC server bound later.

    The worker registers its address before it has built the engine its server needs; holding
    the port until the server has bound it keeps another process from taking it meanwhile.
    NOTE: gRPC sets SO_REUSEPORT on its listeners by default, so it can bind the held port.
    """

    def __init__(self, host: str) -> None:
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._sock.bind((host.strip("[]"), 0))
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        self._sock.close()


def advertised_host(bind_host: str, peer: str) -> str:
    """The host a peer can reach us at: the bind host, or for a wildcard bind the local address
    of the route to `peer` (host:port)."""
    if bind_host not in ANY_HOSTS:
        return bind_host
    peer_host = peer.rsplit(":", 1)[0].strip("[]")
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as probe:
        probe.connect((peer_host, 9))  # UDP connect sends nothing; it only picks the route
        return probe.getsockname()[0]
