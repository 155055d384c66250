"""The controller process: one gRPC server with the worker registry, inference router, admin API,
`grpc.health.v1` (the readiness gate) and reflection (assembled in grpc_server.py), plus the
reconcile loop.

The gRPC server is a `grpc.aio` one on an event loop in a thread of its own: every streamed
response is written from that one thread, where a sync server spends a thread (and its wake-ups)
per stream; on a small machine the controller's CPU per token is what serving costs beyond the
engine. `ControllerServer`'s own API stays synchronous. The HTTP API routes on uvicorn's loop
(controller/router/http/bridge.py), with channels of its own to the workers made there.

Run one by hand with `python -m intentserve.controller.server` (configured by
`INTENTSERVE_*` env vars).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from grpc_health.v1 import _async as async_health
from grpc_health.v1 import health
from intentserve.controller.aio_loop import EventLoopThread, HealthPublisher
from intentserve.controller.auth import SecurityError
from intentserve.controller.control.deployment import Deployment, deployment_state
from intentserve.controller.control.metrics import DeploymentCollector
from intentserve.controller.control.reconcile import Reconciler
from intentserve.controller.control.state import DeploymentState
from intentserve.controller.control.table_feed import TableFeed
from intentserve.controller.embedded import EmbeddedTable, EmbeddedView
from intentserve.controller.event_loop import choose_event_loop, register_loop_info
from intentserve.controller.grpc_server import build_grpc_server, build_probe_server
from intentserve.controller.router.http.server import HttpServer
from intentserve.controller.router.request_path import RequestPath
from intentserve.controller.settings import (
    ControllerConfig,
    ControllerSettings,
    describe_errors,
)
from intentserve.policy import IntentError, Reason, ReasonCode, Verdict
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

log = logging.getLogger(__name__)

END_WAIT_S = 1.0  # after the grace: for ended streams to send their status, before a cancel
STOPPING = Reason(
    ReasonCode.WORKER_NOT_SERVING,
    "the controller is stopping (intentserve down, SIGTERM or Ctrl-C); the stream was ended",
)


class ControllerServer:
    """`start()`, then `wait_until_settled()` / `wait()`, then `stop()`; or use it as a context."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        loop_choice = choose_event_loop()  # first: a word it does not know is refused at once
        self._shutdown = threading.Event()
        # Every registry transition wakes the loop, so health follows a report at once, and
        # the admission queue, whose head may find a slot (or learn there is none to wait for).
        self.deployment = Deployment(
            config.desired,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            on_change=self._workers_changed,
        )
        # Requests are measured where both front ends (gRPC, HTTP) take the router's responses,
        # and while they wait in the router's admission queue.
        self.metrics = CollectorRegistry()
        desired = config.desired
        path = RequestPath.build(
            EmbeddedTable(self.deployment),
            self.metrics,
            deployment=desired.deployment,
            model=desired.model_names[0],
            tls=config.security.tls,
            max_outstanding_per_worker=config.max_outstanding_per_worker,
            admission=config.admission,
        )
        self._request_path = path
        self.router, self.metered_router = path.router, path.metered
        # The loop first: health is published to it from the reconciler's construction on.
        self._loop = EventLoopThread("controller-rpc", loop_choice)
        register_loop_info(self.metrics, loop_choice.kind)
        self._probe_health = None if config.health_port is None else health.HealthServicer()
        self._health = HealthPublisher(
            self._loop, async_health.HealthServicer(), self._probe_health
        )
        # What routers watch (the WorkerTable service): published by the reconcile loop.
        self.table_feed = TableFeed()
        self.reconciler = Reconciler(
            self.deployment,
            self.router.channels,
            self.router,
            self._health,
            self.table_feed,
            interval_s=config.reconcile_interval_s,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
        )
        self.metrics.register(
            DeploymentCollector(self.deployment, self.reconciler, config.max_restarts)
        )
        # NOTE: the gRPC server last: grpc.aio cannot stop a server that never started, so a
        # port taken after it was made would leave one behind (its finalizer fails at exit).
        self._http = None
        try:
            self._health_server, self.health_port = build_probe_server(config, self._probe_health)
            self._http = self._http_api()
            self._server, self.bound_port, self.registry_port = self._loop.run(
                build_grpc_server(
                    config,
                    self.deployment,
                    self.metered_router,
                    self._request_path.tokenizing,
                    self.table_feed,
                    self.request_shutdown,
                    self._health.servicer,
                )
            )
        except BaseException:
            self._loop.close()  # NOTE: else a port that is taken leaves its loop thread behind
            if self._http is not None:
                self._http.join()  # never started: this closes its socket
            raise

    def _workers_changed(self) -> None:
        self.reconciler.wake()
        self.router.workers_changed()

    def _http_api(self) -> HttpServer | None:
        config = self.config
        if config.http_port is None:
            return None
        return self._request_path.http_server(
            EmbeddedView(self.deployment, self.reconciler),
            self.metrics,
            security=config.security,
            model_names=config.desired.model_names,
            host=config.host,
            port=config.http_port,
            tls=None if config.http_plaintext else config.security.tls,
            loop=self._loop.choice,
            limits=config.http_limits,
            cors_origins=config.cors_origins,
        )

    @property
    def http_url(self) -> str | None:
        """The HTTP API's base URL on this machine (`https://127.0.0.1:8000`); None: none."""
        if self._http is None:
            return None
        return f"{self._http.scheme}://{self._local_host}:{self._http.port}"

    @property
    def address(self) -> str:
        """Where clients reach it on this machine (loopback when bound to every interface)."""
        return f"{self._local_host}:{self.bound_port}"

    @property
    def registry_address(self) -> str:
        """Where workers on this machine register (the mutual-TLS port; with no TLS, the
        same port as clients)."""
        return f"{self._local_host}:{self.registry_port}"

    @property
    def _local_host(self) -> str:
        host = self.config.host
        return "127.0.0.1" if host in ("0.0.0.0", "[::]", "::") else host

    def start(self) -> ControllerServer:
        self._loop.run(self._server.start())
        if self._health_server is not None:
            self._health_server.start()
        if self._http is not None:
            self._http.start()
        self.reconciler.start()
        log.info(
            "controller %s listening on %s:%d%s",
            self.config.desired.deployment,
            self.config.host,
            self.bound_port,
            f"; HTTP API on {self.http_url}" if self._http is not None else "",
        )
        return self

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Health goes NOT_SERVING and no new call is taken; streams in flight on either front
        end get `grace_s` to finish, then end with UNAVAILABLE naming the stop; then the HTTP
        server's loop and the gRPC server's stop, each closing the channels made on it."""
        if self._loop.closed:
            return  # stopped already
        grace = grace_s or 0.0
        self._health.enter_graceful_shutdown()
        self.request_shutdown()
        self.reconciler.stop()
        if self._health_server is not None:
            self._health_server.stop(0)
        # NOTE: both servers' own cancels come END_WAIT_S after the grace: by then every stream
        # has ended with its reason (a cancel reads "Cancelling all calls"; uvicorn logs its
        # cancels as errors). Calls that are no streams (health watches, idle shared calls) are
        # cancelled then.
        if self._http is not None:
            self._http.begin_stop(grace + END_WAIT_S)
        stopping = self._loop.future(self._server.stop(grace + END_WAIT_S))
        if not self._wait_idle(grace):
            for record in self.deployment.workers():
                self.router.abort_streams(record.worker_id, STOPPING)
        stopping.result()
        if self._http is not None:
            self._http.join()  # its loop closes what was made on it as it ends
        self._loop.run(self.router.channels.aclose_loop())
        self.router.close()
        self._loop.close()

    def _wait_idle(self, timeout_s: float) -> bool:
        """Whether every request through the controller ended within `timeout_s`."""
        deadline_s = time.monotonic() + timeout_s
        while any(r.num_outstanding for r in self.deployment.workers()) or (
            self._http is not None and self._http.num_requests
        ):
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(0.02)
        return True

    def request_shutdown(self) -> None:
        """What Admin.Shutdown does: `wait()` returns; the owner then calls `stop()`."""
        self._shutdown.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until Admin.Shutdown (or `stop()`) is called; False when the timeout passed."""
        return self._shutdown.wait(timeout_s)

    def verdict(self) -> Verdict:
        """The readiness verdict as published to health (ready, failed, reason, per worker)."""
        return self.reconciler.verdict

    def deployment_state(self) -> DeploymentState:
        return deployment_state(self.verdict())

    def wait_until_settled(self, timeout_s: float | None) -> Verdict:
        """Block until the deployment is READY or FAILED (or the timeout passes) and say which.

        The launcher exits non-zero with `verdict.reason` when `verdict.failed`.
        """
        return self.reconciler.wait_until(lambda v: v.ready or v.failed, timeout_s)

    def __enter__(self) -> ControllerServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop(grace_s=0)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = ControllerSettings()
    except ValidationError as error:
        print(f"invalid controller settings:\n{describe_errors(error)}", file=sys.stderr)
        return 2
    try:
        config = settings.config()
    except SecurityError as error:
        print(f"invalid controller settings:\n{error}", file=sys.stderr)
        return 2
    try:
        server = ControllerServer(config).start()
    except IntentError as error:  # INTENTSERVE_EVENT_LOOP names no loop it can run
        print(f"invalid controller settings:\n{error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # the port is taken or the host is not ours
        print(
            f"cannot start the controller on {settings.host}:{settings.port}: {error}",
            file=sys.stderr,
        )
        return 1
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: server.request_shutdown())
    print(
        f"controller {settings.deployment} listening on {settings.host}:{server.bound_port}",
        flush=True,
    )
    server.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
