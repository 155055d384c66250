"""The HTTP API's server: uvicorn on a thread of the controller process, on a socket bound when
it is made (a taken port fails at once, as gRPC's does), HTTPS with the controller's own
certificate unless the deployment is insecure. It reads each request under the deadlines and
connection caps of its `HttpLimits` (connection_limits.py, connection_guard.py).

uvicorn reads the certificate and key from files: they are written to a private temporary folder
(owner-only), loaded once into the TLS context, and removed before the server starts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from intentserve.common.tls import TlsIdentity
from intentserve.controller.event_loop import EventLoopChoice
from intentserve.controller.router.http.connection_guard import ConnectionGuard
from intentserve.controller.router.http.connection_limits import HttpLimits
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0


class HttpServer:
    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        tls: TlsIdentity | None,
        on_stopped: Callable[[], Awaitable[None]],
        loop: EventLoopChoice,
        limits: HttpLimits,
        metrics: CollectorRegistry,
    ) -> None:
        """`on_stopped`: awaited on the server's loop once it has stopped serving, before the
        loop closes: what was made on that loop (grpc.aio channels) is closed there. `loop`:
        the kind of event loop it runs on (the gRPC servers' kind). `limits`: its deadlines
        and caps, metered in `metrics`."""
        try:
            self._socket = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
            )
        except OSError as error:
            raise RuntimeError(f"cannot serve HTTP on {host}:{port}: {error}") from None
        self.port = self._socket.getsockname()[1]
        self.scheme = "http" if tls is None else "https"
        config = _load_config(app, tls, ConnectionGuard(limits, metrics))
        self._server = uvicorn.Server(config)
        self._on_stopped = on_stopped
        self._new_loop = loop.new_loop
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline_s = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline_s:
                raise RuntimeError("the HTTP server did not start (see the log)")
            time.sleep(0.01)

    @property
    def num_requests(self) -> int:
        """Requests being answered (streams included)."""
        return len(self._server.server_state.tasks)

    def begin_stop(self, timeout_s: float) -> None:
        """Stop accepting; requests in flight are cancelled after `timeout_s` (at least 1 s).
        NOTE: the owner ends them with their reason first: uvicorn logs a cancelled one as an
        error, with a traceback."""
        self._server.config.timeout_graceful_shutdown = max(math.ceil(timeout_s), 1)
        self._server.should_exit = True

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=self._new_loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            await self._on_stopped()

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()


def _load_config(app: FastAPI, tls: TlsIdentity | None, guard: ConnectionGuard) -> uvicorn.Config:
    settings = {
        "lifespan": "off",
        "log_config": None,  # NOTE: the process's logging stays as its owner set it up
        "access_log": False,
        "timeout_graceful_shutdown": 1,
        "http": guard.protocol,
        # NOTE: no WebSocket is served; an upgraded connection would leave the guard's count.
        "ws": "none",
        "timeout_keep_alive": guard.limits.keep_alive_timeout_s,
    }
    if tls is None:
        config = uvicorn.Config(app, **settings)
        config.load()
        return config
    folder = Path(tempfile.mkdtemp(prefix="intentserve-https-"))  # NOTE: mode 0700
    try:
        cert_file, key_file = folder / "controller.crt", folder / "controller.key"
        cert_file.write_bytes(tls.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(tls.key_pem)
        config = uvicorn.Config(
            app, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file), **settings
        )
        config.load()  # reads both into the TLS context; the files are not needed after this
        return config
    finally:
        shutil.rmtree(folder, ignore_errors=True)
