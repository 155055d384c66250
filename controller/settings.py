"""Controller configuration: the frozen `ControllerConfig` the server runs with, and
`ControllerSettings`, the edge that reads it from env vars `INTENTSERVE_*`.

The manifest (`intentserve up`) builds a `ControllerConfig` directly from its own typed fields;
`python -m intentserve.controller.server` reads one from the environment here. A bad
value is refused at the edge with a message that names the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from intentserve.common.addresses import is_loopback
from intentserve.common.tls import TlsIdentity
from intentserve.controller.auth import Security, SecurityError, read_secret_lines
from intentserve.controller.control.state import DEFAULT_MODEL, DesiredState
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
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    DEFAULT_BLOCK_SIZE,
    BackendIntent,
    DeviceKind,
    IntentError,
    KvBudget,
    KvCacheDtype,
    Mode,
    WeightFormat,
    paged_attention_intent,
)
from intentserve.policy.config import MAX_BLOCK_SIZE
from intentserve.policy.modes import allowed_values, lookup_choice
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "INTENTSERVE_"


def parse_devices(value: object) -> frozenset[DeviceKind]:
    """`"cuda,cpu"`, `"cuda cpu"`, `""` or a list of names -> the device kinds."""
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    if not isinstance(items, list | tuple | set | frozenset):
        raise IntentError("auto_enabled_devices", f"expected a list of devices, got {value!r}")
    devices = set()
    for item in items:
        device = lookup_choice(DeviceKind, item)
        if device is None:
            raise IntentError(
                "auto_enabled_devices",
                f"invalid value {item!r}; allowed values are {allowed_values(DeviceKind)}",
            )
        devices.add(device)
    return frozenset(devices)


@dataclass(frozen=True)
class ControllerConfig:
    """What one controller process runs with: the desired state, where it listens, its timings."""

    desired: DesiredState
    security: Security = Security()  # the default, no TLS and no tokens, is for tests only
    host: str = "127.0.0.1"
    port: int = 50051  # 0 picks a free port
    registry_port: int = 0  # with TLS: the workers' mutual-TLS port; 0 picks a free one
    # A plaintext port that serves only `grpc.health.v1` (Kubernetes' gRPC probes speak no TLS);
    # None: none. It says SERVING or NOT_SERVING, nothing else.
    health_port: int | None = None
    # The OpenAI-compatible HTTP API, /health and /metrics (HTTPS with the controller's
    # certificate when `security.tls` is set); None: none. 0 picks a free port.
    http_port: int | None = None
    cors_origins: tuple[str, ...] = ()  # browser origins the HTTP API allows; none: CORS off
    http_limits: HttpLimits = HttpLimits()  # the HTTP API's deadlines and connection caps
    # The HTTP API in plaintext while gRPC keeps TLS (the manifest's security.plaintextHttp:
    # loopback only, with API keys).
    http_plaintext: bool = False
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    reconcile_interval_s: float = 0.5
    # Requests sent to each worker at once; None: the sequence slots it realized.
    max_outstanding_per_worker: int | None = None
    admission: QueueLimits = QueueLimits()  # the queue where requests wait for a slot
    max_restarts: int | None = None  # each worker's restart budget (for metrics); None: unknown


class ControllerSettings(BaseSettings):
    """Everything the controller process needs; every field is also `INTENTSERVE_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, description="0 picks a free port")
    deployment: str = Field("intentserve", min_length=1, description="the health service name")
    model: str = Field(DEFAULT_MODEL, min_length=1, description="the model id HTTP clients name")
    served_name: str | None = Field(None, min_length=1, description="another name for `model`")

    # The intent (see README: the contract).
    paged_attention: Mode = Mode.AUTO
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=MAX_BLOCK_SIZE)
    kv_cache_bytes: int | None = Field(None, gt=0)
    kv_cache_fraction: float | None = Field(None, gt=0.0, le=1.0)
    prefix_caching: Mode = Mode.AUTO
    attention_backend: BackendIntent = BackendIntent.AUTO
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    weights: WeightFormat = WeightFormat.AUTO
    auto_enabled_devices: Annotated[frozenset[DeviceKind], NoDecode] = DEFAULT_AUTO_DEVICES

    # Replicas and readiness.
    replicas: int = Field(1, ge=1)
    min_ready: int | None = Field(None, ge=1, description="default: replicas")

    # Timings (seconds) and load limits.
    heartbeat_interval_s: float = Field(1.0, gt=0.0)
    heartbeat_timeout_s: float = Field(5.0, gt=0.0)
    reconcile_interval_s: float = Field(0.5, gt=0.0)
    max_outstanding_per_worker: int | None = Field(
        None, ge=1, description="default: each worker's realized sequence slots"
    )
    max_queued: int | None = Field(
        None, ge=0, description=f"default: {QUEUED_PER_SLOT} x the READY workers' slots"
    )
    max_queue_wait_s: float = Field(DEFAULT_MAX_QUEUE_WAIT_S, gt=0.0, allow_inf_nan=False)

    # Security (README: Security). TLS needs all three files; without them the operator must
    # say `insecure` (plaintext, no worker identity), and off loopback `insecure_network` too.
    registry_port: int = Field(0, ge=0, le=65535, description="workers' mutual-TLS port")
    health_port: int | None = Field(None, ge=0, le=65535, description="plaintext health only")
    http_port: int | None = Field(None, ge=0, le=65535, description="the OpenAI-compatible API")
    cors_origins: tuple[str, ...] = ()  # browser origins the HTTP API allows; none: CORS off
    # The HTTP API's deadlines on reading a request, and its connection caps (README: Security).
    http_header_timeout_s: float = Field(DEFAULT_HEADER_TIMEOUT_S, gt=0.0, allow_inf_nan=False)
    http_body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0.0, allow_inf_nan=False)
    http_keep_alive_timeout_s: float = Field(
        DEFAULT_KEEP_ALIVE_TIMEOUT_S, gt=0.0, allow_inf_nan=False
    )
    http_max_connections_per_client: int = Field(DEFAULT_MAX_CONNECTIONS_PER_CLIENT, ge=1)
    http_max_connections: int = Field(DEFAULT_MAX_CONNECTIONS, ge=1)
    http_responses_store_size: int = Field(DEFAULT_RESPONSES_STORE_SIZE, ge=1)
    # `anthropic-beta` names taken without doing what they ask (a JSON list in the environment).
    http_anthropic_betas_ignored: tuple[str, ...] = ()
    tls_cert_file: str | None = None  # the controller's certificate (common name `controller`)
    tls_key_file: str | None = None
    tls_ca_file: str | None = None  # the deployment's CA, which signed every worker certificate
    insecure: bool = False
    insecure_network: bool = False
    admin_token_file: str | None = None  # one token per line; set: Admin needs one
    api_keys_file: str | None = None  # one key per line; set: Inference needs one

    @field_validator("paged_attention", "prefix_caching", mode="before")
    @classmethod
    def _mode(cls, value: object, info) -> Mode:
        return Mode.parse(value, info.field_name)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_origins(value)

    @field_validator("attention_backend", mode="before")
    @classmethod
    def _backend(cls, value: object, info) -> BackendIntent:
        return BackendIntent.parse(value, info.field_name)

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _dtype(cls, value: object, info) -> KvCacheDtype:
        return KvCacheDtype.parse(value, info.field_name)

    @field_validator("weights", mode="before")
    @classmethod
    def _weights(cls, value: object, info) -> WeightFormat:
        return WeightFormat.parse(value, info.field_name)

    @field_validator("auto_enabled_devices", mode="before")
    @classmethod
    def _devices(cls, value: object) -> frozenset[DeviceKind]:
        return parse_devices(value)

    @model_validator(mode="after")
    def _consistent(self) -> ControllerSettings:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g}) must be longer than "
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g})"
            )
        self.desired_state()  # conflicting intent fields raise IntentError naming the field
        self._check_security()
        return self

    def _check_security(self) -> None:
        files = (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if any(files) and not all(files):
            raise ValueError("tls_cert_file, tls_key_file and tls_ca_file go together")
        if all(files) and self.insecure:
            raise ValueError("insecure is true, but TLS files are given; choose one")
        if not any(files) and not self.insecure:
            raise ValueError(
                "tls_cert_file: no TLS files are given; give tls_cert_file, tls_key_file and "
                "tls_ca_file, or set insecure=true (plaintext, workers unauthenticated)"
            )
        if self.insecure and not is_loopback(self.host) and not self.insecure_network:
            raise ValueError(
                f"insecure: the controller would bind {self.host} in plaintext; set "
                "insecure_network=true to accept that off loopback"
            )

    def security(self) -> Security:
        """The TLS identity and the secrets, read from their files (errors name the field)."""
        tls = None
        if self.tls_cert_file:
            paths = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
            try:
                tls = TlsIdentity(*(Path(f).read_bytes() for f in paths))
            except OSError as error:
                raise SecurityError(f"tls files: {error}") from None
        tokens = keys = frozenset()
        if self.admin_token_file:
            tokens = read_secret_lines(self.admin_token_file, "admin_token_file")
        if self.api_keys_file:
            keys = read_secret_lines(self.api_keys_file, "api_keys_file")
        return Security(tls, tokens, keys)

    def desired_state(self) -> DesiredState:
        given = self.model_fields_set
        return DesiredState(
            deployment=self.deployment,
            policy=paged_attention_intent(
                self.paged_attention,
                block_size=self.block_size if "block_size" in given else None,
                prefix_caching=self.prefix_caching if "prefix_caching" in given else None,
                backend=self.attention_backend if "attention_backend" in given else None,
                kv_cache_dtype=self.kv_cache_dtype if "kv_cache_dtype" in given else None,
            ),
            kv_budget=KvBudget(self.kv_cache_bytes, self.kv_cache_fraction),
            auto_devices=self.auto_enabled_devices,
            replicas=self.replicas,
            min_ready=self.min_ready or self.replicas,
            model=self.model,
            served_name=self.served_name,
            weights=self.weights,
        )

    def config(self) -> ControllerConfig:
        return ControllerConfig(
            desired=self.desired_state(),
            security=self.security(),
            host=self.host,
            port=self.port,
            registry_port=self.registry_port,
            health_port=self.health_port,
            http_port=self.http_port,
            cors_origins=self.cors_origins,
            http_limits=HttpLimits(
                header_timeout_s=self.http_header_timeout_s,
                body_timeout_s=self.http_body_timeout_s,
                keep_alive_timeout_s=self.http_keep_alive_timeout_s,
                max_connections_per_client=self.http_max_connections_per_client,
                max_connections=self.http_max_connections,
                responses_store_size=self.http_responses_store_size,
                anthropic_betas_ignored=check_ignored_betas(self.http_anthropic_betas_ignored),
            ),
            heartbeat_interval_s=self.heartbeat_interval_s,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            reconcile_interval_s=self.reconcile_interval_s,
            max_outstanding_per_worker=self.max_outstanding_per_worker,
            admission=QueueLimits(self.max_queued, self.max_queue_wait_s),
        )


def describe_errors(error) -> str:
    """One line per invalid field of a pydantic `ValidationError`, naming its env var."""
    lines = []
    for item in error.errors():
        name = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ").removeprefix(f"{name}: ")
        where = f"{name} ({ENV_PREFIX}{name.upper()}): " if name else ""
        lines.append(f"{where}{message}")
    return "\n".join(lines)
