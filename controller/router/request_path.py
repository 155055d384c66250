"""A router's request path, assembled the same way by the embedded router (controller/server.py)
and a separate one (router/server.py): the router over its worker table, with its request
metrics, and its HTTP front end."""

from __future__ import annotations

from dataclasses import dataclass

from intentserve.common.tls import TlsIdentity
from intentserve.controller.auth import Security
from intentserve.controller.event_loop import EventLoopChoice
from intentserve.controller.router.admission import QueueLimits
from intentserve.controller.router.channels import worker_aio_channels, worker_channels
from intentserve.controller.router.http.app import Frontend, build_app
from intentserve.controller.router.http.connection_limits import HttpLimits
from intentserve.controller.router.http.server import HttpServer
from intentserve.controller.router.request_metrics import MeteredRouter, RequestMetrics
from intentserve.controller.router.routing import Router
from intentserve.controller.router.table import WorkerTable
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.controller.router.view import DeploymentView
from prometheus_client import CollectorRegistry


@dataclass(frozen=True)
class RequestPath:
    router: Router
    metered: MeteredRouter  # what both front ends call: requests measured where they answer
    tokenizing: TokenizeRoute  # Tokenize / Detokenize, asked of a READY worker

    @classmethod
    def build(
        cls,
        table: WorkerTable,
        metrics: CollectorRegistry,
        *,
        deployment: str,
        model: str,
        tls: TlsIdentity | None,
        max_outstanding_per_worker: int | None,
        admission: QueueLimits,
    ) -> RequestPath:
        """`tls`: the identity the router calls the workers with (`controller` or `router`)."""
        request_metrics = RequestMetrics(metrics, deployment=deployment, model=model)
        router = Router(
            table,
            max_outstanding_per_worker=max_outstanding_per_worker,
            queue_limits=admission,
            queue_wait_times=request_metrics.queue_wait_times,
            channel_factory=worker_channels(tls, deployment),
            aio_channel_factory=worker_aio_channels(tls, deployment),
        )
        request_metrics.watch_queue(router.queue)
        tokenizing = TokenizeRoute(table, router.channels)
        return cls(router, MeteredRouter(router, request_metrics), tokenizing)

    def http_server(
        self,
        view: DeploymentView,
        metrics: CollectorRegistry,
        *,
        security: Security,
        model_names: tuple[str, ...],
        host: str,
        port: int,
        tls: TlsIdentity | None,
        loop: EventLoopChoice,
        limits: HttpLimits,
        cors_origins: tuple[str, ...] = (),
    ) -> HttpServer:
        """The OpenAI HTTP API, /health and /metrics on `host:port` (HTTPS with `tls`), on an
        event loop of the kind `loop` names, reading requests under `limits`."""
        frontend = Frontend(
            self.metered,
            view,
            security,
            model_names,
            metrics,
            self.tokenizing,
            cors_origins,
            responses_store_size=limits.responses_store_size,
            anthropic_betas_ignored=limits.anthropic_betas_ignored,
        )
        return HttpServer(
            build_app(frontend),
            host,
            port,
            tls,
            on_stopped=self.router.channels.aclose_loop,
            loop=loop,
            limits=limits,
            metrics=metrics,
        )
