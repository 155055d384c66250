"""`spec.controller`: where the controller listens (gRPC, its registry, health and HTTP ports),
how it hears from its workers, and how requests queue for them."""

from __future__ import annotations

from intentserve.controller.launch.section import Section
from intentserve.controller.router.admission import (
    DEFAULT_MAX_QUEUE_WAIT_S,
    QUEUED_PER_SLOT,
    QueueLimits,
)
from intentserve.controller.router.http.anthropic_betas import check_ignored_betas
from intentserve.controller.router.http.connection_limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_RESPONSES_STORE_SIZE,
    HttpLimits,
)
from intentserve.controller.router.http.cors import check_origins
from pydantic import Field, ValidationInfo, field_validator

DEFAULT_HTTP_PORT = 8000  # vLLM's and most OpenAI-compatible servers'


class HttpLimitsSpec(Section):
    """How long the HTTP API waits on a client's request, and how many connections clients may
    hold (the controller's HTTP API and a separate router's; defaults and why:
    controller/router/http/connection_limits.py). Nothing here times a response."""

    # From a connection's opening (or the first byte of a next request) to its head's end.
    header_timeout_s: float = Field(DEFAULT_HEADER_TIMEOUT_S, gt=0, allow_inf_nan=False)
    # From the head's end to the body's last byte.
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0, allow_inf_nan=False)
    # Idle between requests on a kept-alive connection.
    keep_alive_timeout_s: float = Field(DEFAULT_KEEP_ALIVE_TIMEOUT_S, gt=0, allow_inf_nan=False)
    # Connections open at once from one address (behind a proxy: all of the proxy's), and in all.
    max_connections_per_client: int = Field(DEFAULT_MAX_CONNECTIONS_PER_CLIENT, ge=1)
    max_connections: int = Field(DEFAULT_MAX_CONNECTIONS, ge=1)
    # Responses kept per API key for previous_response_id and GET /v1/responses/{id}.
    responses_store_size: int = Field(DEFAULT_RESPONSES_STORE_SIZE, ge=1)
    # `anthropic-beta` names taken without doing what they ask, each said back to the client
    # (`claude-code-20250219`, say, to serve Claude Code); none: an unknown beta is refused.
    anthropic_betas_ignored: tuple[str, ...] = ()

    @field_validator("anthropic_betas_ignored")
    @classmethod
    def _beta_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return check_ignored_betas(names)

    def limits(self) -> HttpLimits:
        return HttpLimits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            keep_alive_timeout_s=self.keep_alive_timeout_s,
            max_connections_per_client=self.max_connections_per_client,
            max_connections=self.max_connections,
            responses_store_size=self.responses_store_size,
            anthropic_betas_ignored=self.anthropic_betas_ignored,
        )


class HttpSpec(HttpLimitsSpec):
    """The HTTP API's options beyond its port: its limits, and CORS."""

    # Browser origins allowed to call the API cross-origin (`https://app.example`, or `*`);
    # empty: CORS off, as by default.
    cors_origins: tuple[str, ...] = ()

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_origins(value)


class AdmissionSpec(Section):
    """The queue where requests wait, in arrival order, while every worker slot is taken."""

    max_queued: int | None = Field(
        None, ge=0, description=f"default: {QUEUED_PER_SLOT} x the READY workers' slots"
    )
    max_queue_wait_s: float = Field(DEFAULT_MAX_QUEUE_WAIT_S, gt=0, allow_inf_nan=False)

    def limits(self) -> QueueLimits:
        return QueueLimits(self.max_queued, self.max_queue_wait_s)


class ControllerSpec(Section):
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, description="0 picks a free port")
    # With TLS, workers register on a port of their own, where TLS requires their certificate.
    registry_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    # Plaintext, health only, for probes that speak no TLS (Kubernetes' gRPC probe).
    health_port: int | None = Field(None, ge=0, le=65535)
    # The OpenAI-compatible HTTP API with /health and /metrics, on `host` like gRPC (HTTPS with
    # the controller's certificate unless insecure); null: none.
    http_port: int | None = Field(DEFAULT_HTTP_PORT, ge=0, le=65535)
    http: HttpSpec = HttpSpec()
    advertise_host: str | None = None  # where workers reach it; default: found from the route
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(5.0, gt=0)
    # On shutdown (SIGTERM, Ctrl-C, `down`): how long streams in flight may run to their end
    # before they are cancelled. Under Kubernetes, below the pod's terminationGracePeriodSeconds.
    drain_timeout_s: float = Field(2.0, ge=0, allow_inf_nan=False)
    # Requests sent to each worker at once; null: the sequence slots it realized.
    max_outstanding_per_worker: int | None = Field(None, ge=1)
    admission: AdmissionSpec = AdmissionSpec()

    @field_validator("heartbeat_timeout_s")
    @classmethod
    def _timeout(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("heartbeat_interval_s")
        if interval is not None and value <= interval:
            raise ValueError(f"must be longer than heartbeatIntervalS ({interval:g})")
        return value
