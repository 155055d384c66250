"""A separate router process: the request path alone, fed the verified worker table by the
controller's watch stream, streaming from the workers directly with its own certificate.

    config = RouterConfig("local", controller="127.0.0.1:50052", port=0)
    with RouterServer(config) as router:          # start() ... stop()
        router.address                            # where clients call Inference

Its gRPC server serves `Inference` (as the controller's does), `grpc.health.v1` (SERVING while
the table it routes by is ready and not expired), `Admin.Status` (its table and freshness) and
reflection; with `http_port`, the OpenAI HTTP API, `/health` and `/metrics` (the table's
freshness among them) beside it. A test (or a benchmark) can feed the table itself:
`RouterServer(config, watch=False)`, then `router.table.apply(update)`.

Run one with `intentserve router` (controller/cli/router.py).
"""

from __future__ import annotations

import logging
import threading

import grpc
import grpc.aio
from grpc_health.v1 import _async as async_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from intentserve.common.status import AsyncErrorInterceptor
from intentserve.common.streaming import MAX_COMMAND_BYTES
from intentserve.common.tls import CONTROLLER, secure_channel, server_credentials, server_name
from intentserve.controller.aio_loop import EventLoopThread, HealthPublisher
from intentserve.controller.auth import AuthInterceptor
from intentserve.controller.event_loop import choose_event_loop, register_loop_info
from intentserve.controller.pending_calls import PENDING_CALL_LIMITS
from intentserve.controller.router.http.server import HttpServer
from intentserve.controller.router.request_path import RequestPath
from intentserve.controller.router.servicer import InferenceServicer, RouterAdminServicer
from intentserve.controller.router.settings import RouterConfig
from intentserve.controller.router.table_metrics import TableCollector
from intentserve.controller.router.view import TableView
from intentserve.controller.router.watch import TableWatch
from intentserve.controller.router.watched import Freshness, WatchedTable
from intentserve.controller.status_codes import STATUS_CODES
from intentserve.policy import Reason
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class RouterServer:
    def __init__(self, config: RouterConfig, *, watch: bool = True) -> None:
        """`watch`: follow the controller's table (False: the caller feeds `table`)."""
        self.config = config
        loop_choice = choose_event_loop()  # first: a word it does not know is refused at once
        tls = config.security.tls
        self.table = WatchedTable(config.controller, max_stale_s=config.max_stale_s)
        self.metrics = CollectorRegistry()
        self.metrics.register(TableCollector(self.table, config.deployment))
        self._request_path = path = RequestPath.build(
            self.table,
            self.metrics,
            deployment=config.deployment,
            model=config.model,
            tls=tls,
            max_outstanding_per_worker=config.max_outstanding_per_worker,
            admission=config.admission,
        )
        self.router, self.metered_router = path.router, path.metered
        self._controller_channel: grpc.Channel | None = None
        self._watch: TableWatch | None = None
        if watch:
            self._controller_channel = _controller_channel(config)
            tokens = config.security.admin_tokens
            metadata = () if tls is not None or not tokens else _bearer(min(tokens))
            self._watch = TableWatch(
                self._controller_channel,
                self.table,
                self.router,
                router_id=config.router_id,
                metadata=metadata,
            )
        self._loop = EventLoopThread("router-rpc", loop_choice)
        register_loop_info(self.metrics, loop_choice.kind)
        self._health = HealthPublisher(self._loop, async_health.HealthServicer(), None)
        self._health_status: int | None = None
        self._said: tuple[Freshness, Reason] | None = None  # what the log last said
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="router-health", daemon=True)
        # NOTE: the gRPC server last: grpc.aio cannot stop a server that never started, so a
        # port taken after it was made would leave one behind (its finalizer fails at exit).
        self._http = None
        try:
            self._http = self._http_api()
            self._server, self.bound_port = self._loop.run(self._build_server())
        except BaseException:
            self._loop.close()
            if self._http is not None:
                self._http.join()  # never started: this closes its socket
            raise

    @property
    def address(self) -> str:
        return f"{self._local_host}:{self.bound_port}"

    @property
    def http_url(self) -> str | None:
        """The HTTP API's base URL on this machine; None: none."""
        if self._http is None:
            return None
        return f"{self._http.scheme}://{self._local_host}:{self._http.port}"

    @property
    def _local_host(self) -> str:
        host = self.config.host
        return "127.0.0.1" if host in ("0.0.0.0", "[::]", "::") else host

    def _http_api(self) -> HttpServer | None:
        config = self.config
        if config.http_port is None:
            return None
        return self._request_path.http_server(
            TableView(self.table),
            self.metrics,
            security=config.security,
            model_names=(config.model,),
            host=config.host,
            port=config.http_port,
            tls=config.security.tls,
            loop=self._loop.choice,
            limits=config.http_limits,
        )

    def start(self) -> RouterServer:
        self._follow_table()
        self._loop.run(self._server.start())
        if self._http is not None:
            self._http.start()
        if self._watch is not None:
            self._watch.start()
        self._ticker.start()
        log.info(
            "router for %s listening on %s:%d, watching the controller at %s",
            self.config.deployment,
            self.config.host,
            self.bound_port,
            self.config.controller,
        )
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        if self._loop.closed:
            return
        self._stop.set()
        self._health.enter_graceful_shutdown()
        if self._ticker.is_alive():
            self._ticker.join()
        if self._watch is not None:
            self._watch.stop()
        if self._http is not None:
            self._http.begin_stop(grace_s)
        self._loop.run(self._server.stop(grace_s))
        if self._http is not None:
            self._http.join()  # its loop closes what was made on it as it ends
        self._loop.run(self.router.channels.aclose_loop())
        self.router.close()
        if self._controller_channel is not None:
            self._controller_channel.close()
        self._loop.close()

    def __enter__(self) -> RouterServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop(grace_s=0)

    def _tick(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self._follow_table()
            except Exception:  # NOTE: one failed pass is logged; health keeps being followed
                log.exception("following the worker table's freshness failed")

    def _follow_table(self) -> None:
        """Health says what the table allows (SERVING while it is ready and not expired); each
        change of freshness is logged once, and while the table is stale each change of why (a
        new controller re-establishing its table is said so). An expired table's reason counts
        the seconds: it is said once."""
        readiness = self.table.readiness()
        status = self.table.status()
        said = (status.freshness, readiness.reason)
        if self._said is not None and (
            status.freshness is not self._said[0]
            or (status.freshness is Freshness.STALE and readiness.reason != self._said[1])
        ):
            level = logging.INFO if status.freshness is Freshness.FRESH else logging.WARNING
            log.log(level, "worker table %s: %s", status.freshness.value, readiness.reason)
        self._said = said
        self._watch_suspects()
        serving = SERVING if readiness.ready else NOT_SERVING
        if serving != self._health_status:
            for service in ("", self.config.deployment):
                self._health.set(service, serving)
            self._health_status = serving

    def _watch_suspects(self) -> None:
        """A worker whose stream broke here is watched (a health stream to it), and routed to
        again once that watch is answered; channels to workers the table no longer holds go."""
        channels = self.router.channels
        channels.prune(self.table.addresses())
        suspects = self.table.suspects()
        channels.watch(suspects)
        for address, worker_id in suspects.items():
            if channels.connected(address):
                self.table.restore(worker_id)
                log.info("worker %s answers again: routed to again", worker_id)

    async def _build_server(self) -> tuple[grpc.aio.Server, int]:
        config = self.config
        server = grpc.aio.server(
            interceptors=[
                AuthInterceptor(config.security, config.deployment, frozenset),
                AsyncErrorInterceptor(STATUS_CODES),
            ],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_COMMAND_BYTES),
                *PENDING_CALL_LIMITS,
            ],
        )
        inference_pb2_grpc.add_InferenceServicer_to_server(
            InferenceServicer(self.metered_router, self._request_path.tokenizing), server
        )
        admin_pb2_grpc.add_AdminServicer_to_server(
            RouterAdminServicer(config.deployment, self.table), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health.servicer, server)
        reflection.enable_server_reflection(SERVICE_NAMES, server)
        address = f"{config.host}:{config.port}"
        tls = config.security.tls
        if tls is None:
            return server, server.add_insecure_port(address)
        credentials = server_credentials(tls, require_client_auth=False)
        return server, server.add_secure_port(address, credentials)


def _controller_channel(config: RouterConfig) -> grpc.Channel:
    """To the controller's WorkerTable: with TLS, the controller verified as itself and the
    router's certificate presented (on the controller's mutual-TLS port)."""
    options = (("grpc.keepalive_time_ms", 10_000),)
    tls = config.security.tls
    if tls is None:
        return grpc.insecure_channel(config.controller, options=options)
    name = server_name(config.deployment, CONTROLLER)
    return secure_channel(config.controller, tls, name, options=options)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)
