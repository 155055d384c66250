"""The controller process: one gRPC server with the worker registry, inference router, admin API,
`grpc.health.v1` (the readiness gate) and reflection, plus the reconcile loop.

Run one by hand with `python -m intentserve.controller.service.server` (configured by
`INTENTSERVE_*` env vars).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from intentserve.controller.http.app import Frontend, build_app
from intentserve.controller.http.metrics import DeploymentCollector
from intentserve.controller.http.server import HttpServer
from intentserve.controller.service.auth import AuthInterceptor, SecurityError
from intentserve.controller.service.deployment import Deployment, deployment_state
from intentserve.controller.service.interceptor import STATUS_CODES
from intentserve.controller.service.reconcile import Reconciler
from intentserve.controller.service.request_metrics import MeteredRouter, RequestMetrics
from intentserve.controller.service.router import Router
from intentserve.controller.service.servicers import (
    AdminServicer,
    InferenceServicer,
    WorkerRegistryServicer,
)
from intentserve.controller.service.settings import (
    ControllerConfig,
    ControllerSettings,
    describe_errors,
)
from intentserve.controller.service.state import DeploymentState
from intentserve.policy import Verdict
from intentserve.status import ErrorInterceptor
from intentserve.streaming import STREAM_READER_OPTIONS
from intentserve.tls import secure_channel, server_credentials, server_name
from intentserve.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

log = logging.getLogger(__name__)

# Threads beyond the admitted streams, so registration, heartbeats, health and admin calls are
# never queued behind inference streams.
CONTROL_THREADS = 16
SERVICE_NAMES = (
    worker_pb2.DESCRIPTOR.services_by_name["WorkerRegistry"].full_name,
    inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


class ControllerServer:
    """`start()`, then `wait_until_settled()` / `wait()`, then `stop()`; or use it as a context."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self._shutdown = threading.Event()
        # Every registry transition wakes the loop, so health follows a report at once.
        self.deployment = Deployment(config.desired, on_change=lambda: self.reconciler.wake())
        self.router = Router(
            self.deployment,
            max_outstanding_per_worker=config.max_outstanding_per_worker,
            max_outstanding_total=config.max_outstanding_total,
            channel_factory=_worker_channels(config),
        )
        self._health = health.HealthServicer()
        self.reconciler = Reconciler(
            self.deployment,
            self.router,
            self._health,
            interval_s=config.reconcile_interval_s,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
        )
        # Requests are measured where both front ends (gRPC, HTTP) take the router's responses.
        self.metrics = CollectorRegistry()
        self.metrics.register(DeploymentCollector(self.deployment, self.reconciler))
        desired = config.desired
        self.metered_router = MeteredRouter(
            self.router,
            RequestMetrics(self.metrics, deployment=desired.deployment, model=desired.model),
        )
        num_threads = config.max_outstanding_total + CONTROL_THREADS
        self._server = grpc.server(
            futures.ThreadPoolExecutor(num_threads, thread_name_prefix="controller-rpc"),
            # NOTE: authorization first: a refused call never reaches the error mapping.
            interceptors=[
                AuthInterceptor(config.security, lambda: frozenset(config.desired.worker_ids)),
                ErrorInterceptor(STATUS_CODES),
            ],
            options=[("grpc.so_reuseport", 0)],  # a second controller on the port is an error
        )
        worker_pb2_grpc.add_WorkerRegistryServicer_to_server(
            WorkerRegistryServicer(self.deployment, config.heartbeat_interval_s), self._server
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(
            InferenceServicer(self.metered_router), self._server
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(self.deployment, self.request_shutdown), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(SERVICE_NAMES, self._server)
        # Probes that speak no TLS get a port of their own, with nothing on it but health.
        self._health_server = None
        self.health_port = None
        if config.health_port is not None:
            self._health_server = grpc.server(futures.ThreadPoolExecutor(2))
            health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
            self.health_port = self._health_server.add_insecure_port(
                f"{config.host}:{config.health_port}"
            )
        tls = config.security.tls
        if tls is None:
            self.bound_port = self._server.add_insecure_port(f"{config.host}:{config.port}")
            self.registry_port = self.bound_port
        else:
            # Two ports: clients and probes need no certificate on the public one; workers
            # register on the other, where TLS itself requires a certificate of the CA.
            # NOTE: grpc's Python API cannot request an optional client certificate.
            public = server_credentials(tls, require_client_auth=False)
            mutual = server_credentials(tls, require_client_auth=True)
            self.bound_port = self._server.add_secure_port(f"{config.host}:{config.port}", public)
            self.registry_port = self._server.add_secure_port(
                f"{config.host}:{config.registry_port}", mutual
            )
        self._http, self._http_threads = None, None
        if config.http_port is not None:
            self._http_threads = futures.ThreadPoolExecutor(num_threads, thread_name_prefix="http")
            frontend = Frontend(
                self.metered_router,
                self.reconciler,
                config.security,
                desired.model,
                self.metrics,
                self._http_threads,
            )
            self._http = HttpServer(build_app(frontend), config.host, config.http_port, tls)

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
        self._server.start()
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
        """Health goes NOT_SERVING, running streams get `grace_s` to finish, then all stops."""
        self._health.enter_graceful_shutdown()
        self.request_shutdown()
        self.reconciler.stop()
        if self._health_server is not None:
            self._health_server.stop(0)
        if self._http is not None:
            self._http.begin_stop(grace_s)
        self._server.stop(grace_s).wait()
        if self._http is not None:
            self._http.join()
            self._http_threads.shutdown(wait=False, cancel_futures=True)
        self.router.close()

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


def _worker_channels(config: ControllerConfig) -> Callable[[str, str], grpc.Channel]:
    """Channels to the workers: with TLS, the worker is verified as itself and the controller
    presents its own certificate (worker servers accept no one else)."""
    tls = config.security.tls
    if tls is None:
        return lambda address, worker_id: grpc.insecure_channel(
            address, options=STREAM_READER_OPTIONS
        )
    deployment = config.desired.deployment
    return lambda address, worker_id: secure_channel(
        address, tls, server_name(deployment, worker_id), options=STREAM_READER_OPTIONS
    )


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
