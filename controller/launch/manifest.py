"""The deployment manifest: a YAML file validated by pydantic, overridable through env vars.

    apiVersion: intentserve/v1
    kind: Deployment
    metadata: {name: local}
    spec: {model: {...}, replicas: 2, resources: {...}, pagedAttention: {...}, scheduler: {...},
           controller: {...}}

Env vars `INTENTSERVE_<PATH>` override the file, one `__` per level and case-insensitive:
`INTENTSERVE_SPEC__REPLICAS=1`, `INTENTSERVE_SPEC__PAGEDATTENTION__MODE=off`.

A bad manifest is refused before anything starts: `ManifestError` has one line per invalid field,
naming its path in the file (`spec.pagedAttention.mode`), the value given and what is allowed.
Shares of free memory (`kvCacheMemory: 60%`) of replicas that share one memory must fit in it:
on one node (the embedded cluster) that is refused here; a joined cluster places the replicas
itself, so `up` only warns there (`shared_kv_problem`).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from intentserve.common.chat_template import ChatTemplate
from intentserve.controller.control.state import (
    DEFAULT_MODEL,
    DesiredState,
    replica_ids,
    served_name_of,
)
from intentserve.controller.launch.router_spec import RouterSpec
from intentserve.controller.launch.validation import describe_validation_error
from intentserve.controller.router.admission import (
    DEFAULT_MAX_QUEUE_WAIT_S,
    QUEUED_PER_SLOT,
    QueueLimits,
)
from intentserve.controller.router.http.cors import check_origins
from intentserve.controller.settings import ENV_PREFIX, ControllerConfig
from intentserve.policy import (
    DEFAULT_AUTO_DEVICES,
    DEFAULT_BLOCK_SIZE,
    BackendIntent,
    DeviceKind,
    IntentError,
    KvBudget,
    KvCacheDtype,
    Mode,
    PagedAttentionConfig,
    SchedulerIntent,
    WeightFormat,
    paged_attention_intent,
)
from intentserve.policy.budget import KV_MEMORY_FORMS, overcommitted, parse_kv_memory
from intentserve.policy.config import MAX_BLOCK_SIZE, PAGED_OPTIONS
from intentserve.policy.modes import allowed_values, lookup_choice
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

API_VERSION = "intentserve/v1"
KIND = "Deployment"
# NOTE: mirrors worker.model.dtype.ALLOWED_DTYPES (controller/ never imports worker/); a test
# keeps the two equal.
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_HTTP_PORT = 8000  # vLLM's and most OpenAI-compatible servers'
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


class ManifestError(ValueError):
    """The manifest cannot be used; `problems` has one line per invalid field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"invalid manifest {source}:\n" + "\n".join(f"  {p}" for p in problems))
        self.source = source
        self.problems = problems


def _choice(enum_cls: type[enum.Enum], value: object) -> enum.Enum:
    """Parse an enum member from the word an operator writes (YAML's bare on/off included)."""
    member = lookup_choice(enum_cls, value)
    if member is None:
        raise ValueError(f"allowed values are {allowed_values(enum_cls)}")
    return member


class _Section(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)


class ModelSpec(_Section):
    name: str = Field(
        DEFAULT_MODEL,
        min_length=1,
        description="short name, .gguf file, folder or cached Hugging Face id",
    )
    # The name HTTP clients give as `model` (the exact reference is accepted too).
    served_name: str | None = Field(
        None, min_length=1, description="default: the short name, or the file's or folder's name"
    )
    dtype: str = "auto"
    weights: WeightFormat = WeightFormat.AUTO
    # For a checkpoint with no chat template (or the wrong one): the template's text, or the
    # path of a file holding it. Read and compiled at load; afterwards always the text.
    chat_template: str | None = Field(
        None, min_length=1, description="a Jinja chat template, or a file's path"
    )

    def served(self) -> str:
        return self.served_name or served_name_of(self.name)

    @field_validator("weights", mode="before")
    @classmethod
    def _weights(cls, value: object) -> WeightFormat:
        return _choice(WeightFormat, value)

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, value: str | None) -> str | None:
        """Text with a Jinja delimiter is the template; anything else names a file."""
        if value is None:
            return None
        if not any(mark in value for mark in ("{{", "{%")):
            try:
                value = Path(value).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(
                    "is neither a template (no {{ or {%) nor a readable file: "
                    f"{type(error).__name__}: {error}"
                ) from None
        ChatTemplate(value)  # ValueError: "chat template does not compile: ..."
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        if value not in MODEL_DTYPES:
            raise ValueError(f"allowed values are {', '.join(MODEL_DTYPES)}")
        return value


class ResourcesSpec(_Section):
    device: DeviceKind = DeviceKind.CPU
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0, validate_default=True)
    device_map: tuple[str, ...] = ()  # device of each decoder layer; empty: all on `device`
    no_kv_cache: bool = False  # debug mode: the worker reports it has no KV cache at all

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: object) -> DeviceKind:
        return _choice(DeviceKind, value)

    @field_validator("num_gpus")
    @classmethod
    def _gpus(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("device") is DeviceKind.CUDA and value <= 0:
            raise ValueError("must be > 0 when device is cuda (a Ray actor sees no GPU without it)")
        return value

    @field_validator("device_map")
    @classmethod
    def _device_map(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in value if not _DEVICE.fullmatch(d)]
        if bad:
            raise ValueError(f"entries must be cpu, cuda or cuda:N; {bad[0]!r} is not")
        return value


# Resources Ray defines itself; a replica asks for them through spec.resources.
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


class PlacementSpec(_Section):
    """Where each replica's actor may run on a joined cluster: the custom resources (as its
    nodes offer them, `ray start --resources '{"node2": 1}'`) each replica needs, in order."""

    replica_resources: tuple[dict[str, float], ...] = ()

    @field_validator("replica_resources")
    @classmethod
    def _resources(cls, value: tuple[dict[str, float], ...]) -> tuple[dict[str, float], ...]:
        for entry in value:
            for name, amount in entry.items():
                if name in RAY_BUILTIN_RESOURCES:
                    raise ValueError(
                        f"{name!r} is set by spec.resources; entries name custom resources of "
                        "the cluster's nodes (e.g. node2: 1)"
                    )
                if amount <= 0:
                    raise ValueError(f"{name} must be more than 0, got {amount:g}")
        return value


class PagedAttentionSpec(_Section):
    mode: Mode = Mode.AUTO
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=MAX_BLOCK_SIZE)
    # Applies in every mode (the contiguous cache too). NoDecode: an env override is the word
    # (`256Mi`), not JSON.
    kv_cache_memory: Annotated[KvBudget, NoDecode] = KvBudget()
    prefix_caching: Mode = Mode.AUTO
    backend: BackendIntent = BackendIntent.AUTO
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    auto_enabled_devices: tuple[DeviceKind, ...] | None = None  # default: policy's (cuda)

    @field_validator("mode", "prefix_caching", mode="before")
    @classmethod
    def _mode(cls, value: object) -> Mode:
        return _choice(Mode, value)

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, value: object) -> BackendIntent:
        return _choice(BackendIntent, value)

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, value: object) -> KvCacheDtype:
        return _choice(KvCacheDtype, value)

    @field_validator("auto_enabled_devices", mode="before")
    @classmethod
    def _devices(cls, value: object) -> object:
        return [_choice(DeviceKind, d) for d in value] if isinstance(value, list) else value

    @field_validator("kv_cache_memory", mode="plain")
    @classmethod
    def _kv_memory(cls, value: object) -> KvBudget:
        try:
            return parse_kv_memory(value)
        except IntentError:
            # NOTE: the manifest's line already names the field and the value given.
            raise ValueError(f"allowed: {KV_MEMORY_FORMS}") from None

    @model_validator(mode="after")
    def _intent(self) -> PagedAttentionSpec:
        self.intent()  # an IntentError names the option; validation.py places it
        return self

    def intent(self) -> PagedAttentionConfig | None:
        """The operator's policy as the typed config; an option not written is not given."""
        given = {n: getattr(self, n) for n in PAGED_OPTIONS if n in self.model_fields_set}
        return paged_attention_intent(self.mode, **given)


# NOTE: the scheduler's numbers reach the workers' reports as uint32 fields; a larger one would
# fail every worker at its report, each restart alike.
_UINT32_MAX = 2**32 - 1


class SchedulerSpec(_Section):
    max_num_seqs: int = Field(16, ge=1, le=_UINT32_MAX)
    max_model_len: int | None = Field(
        None, ge=2, le=_UINT32_MAX, description="default: the model's, capped"
    )
    max_num_batched_tokens: int = Field(2048, ge=1, le=_UINT32_MAX)
    # Tokens per streamed message of each request after its first (which goes out at once); the
    # last message carries what is left. 1: every token as it comes.
    stream_interval: int = Field(1, ge=1, le=_UINT32_MAX, description="tokens per streamed message")


class HttpSpec(_Section):
    """The HTTP API's options beyond its port."""

    # Browser origins allowed to call the API cross-origin (`https://app.example`, or `*`);
    # empty: CORS off, as by default.
    cors_origins: tuple[str, ...] = ()

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_origins(value)


class AdmissionSpec(_Section):
    """The queue where requests wait, in arrival order, while every worker slot is taken."""

    max_queued: int | None = Field(
        None, ge=0, description=f"default: {QUEUED_PER_SLOT} x the READY workers' slots"
    )
    max_queue_wait_s: float = Field(DEFAULT_MAX_QUEUE_WAIT_S, gt=0, allow_inf_nan=False)

    def limits(self) -> QueueLimits:
        return QueueLimits(self.max_queued, self.max_queue_wait_s)


class ControllerSpec(_Section):
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


class SecuritySpec(_Section):
    """Mutual TLS between the controller and its workers, the admin token and the clients' API
    keys (README: Security). The defaults are secure: a fresh CA per `up`."""

    insecure: bool = False  # plaintext, no worker identity: loopback only, unless...
    insecure_network: bool = False  # ...this says that plaintext off loopback is wanted
    ca_cert_file: str | None = None  # the operator's CA (e.g. a Kubernetes Secret), with its key
    ca_key_file: str | None = None
    admin_token_file: str | None = None  # default: a fresh token per `up`
    api_keys_file: str | None = None  # one key per line; set: Inference needs one of them
    # The HTTP API in plaintext, so that a local client needs no CA file, while gRPC and the
    # workers keep TLS. Loopback only, and never open: without apiKeysFile, `up` makes a key.
    plaintext_http: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> SecuritySpec:
        if (self.ca_cert_file is None) != (self.ca_key_file is None):
            missing = "caKeyFile" if self.ca_key_file is None else "caCertFile"
            raise IntentError(missing, "give both caCertFile and caKeyFile, or neither")
        if self.insecure and self.ca_cert_file is not None:
            raise IntentError("insecure", "true, but a CA is given for TLS; choose one")
        if self.insecure_network and not self.insecure:
            raise IntentError("insecureNetwork", "only applies with insecure: true")
        if self.plaintext_http and self.insecure:
            raise IntentError("plaintextHttp", "true, but insecure already makes all plaintext")
        return self


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class DeploymentSpec(_Section):
    model: ModelSpec = ModelSpec()
    replicas: int = Field(1, ge=1)
    min_ready: int | None = Field(None, ge=1, description="default: replicas")
    max_restarts: int = Field(3, ge=-1, description="Ray restarts per worker; -1: unlimited")
    startup_timeout_s: float = Field(300.0, gt=0)
    resources: ResourcesSpec = ResourcesSpec()
    placement: PlacementSpec = PlacementSpec()
    paged_attention: PagedAttentionSpec = PagedAttentionSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    controller: ControllerSpec = ControllerSpec()
    router: RouterSpec = RouterSpec()
    security: SecuritySpec = SecuritySpec()

    @model_validator(mode="after")
    def _exposed(self) -> DeploymentSpec:
        host, s = self.controller.host, self.security
        for who, bound in (("the controller", host), ("a router", self.router.host)):
            if s.insecure and not is_loopback(bound) and not s.insecure_network:
                raise IntentError(
                    "security.insecure",
                    f"true and {who} binds {bound}, not loopback: anyone who reaches it could "
                    "drain the deployment or send requests unauthenticated; remove insecure, "
                    "or also set insecureNetwork: true to accept that",
                )
        if self.security.plaintext_http and not is_loopback(host):
            raise IntentError(
                "security.plaintextHttp",
                f"true and the controller binds {host}, not loopback: API keys would cross the "
                "network in the clear; allowed only with a loopback host (127.0.0.1, ::1)",
            )
        placed = len(self.placement.replica_resources)
        if placed and placed != self.replicas:
            raise IntentError(
                "placement.replicaResources",
                f"{placed} entries for {self.replicas} replicas; give one per replica, in order "
                "(<name>-0, <name>-1, ...), or none",
            )
        return self

    @field_validator("min_ready")
    @classmethod
    def _min_ready(cls, value: int | None, info: ValidationInfo) -> int | None:
        replicas = info.data.get("replicas")
        if value is not None and replicas is not None and value > replicas:
            raise ValueError(f"must be at most replicas ({replicas})")
        return value


class Metadata(_Section):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("must be 1-63 lower-case letters, digits or '-' (a DNS label)")
        return value


class Manifest(BaseSettings):
    """The whole file. The env source comes first, so `INTENTSERVE_SPEC__...` beats the file."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: Metadata
    spec: DeploymentSpec = DeploymentSpec()

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, **_):
        return (env_settings, init_settings)

    @field_validator("api_version")
    @classmethod
    def _api_version(cls, value: str) -> str:
        if value != API_VERSION:
            raise ValueError(f"allowed value is {API_VERSION}")
        return value

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value != KIND:
            raise ValueError(f"allowed value is {KIND}")
        return value

    @property
    def name(self) -> str:
        return self.metadata.name

    def worker_ids(self) -> list[str]:
        return list(replica_ids(self.name, self.spec.replicas))

    def replica_resources(self) -> dict[str, dict[str, float]]:
        """The custom Ray resources each worker's actor needs (spec.placement), by worker id."""
        placed = self.spec.placement.replica_resources or ({},) * self.spec.replicas
        return dict(zip(self.worker_ids(), placed, strict=True))

    def embedded_placement_problem(self) -> str | None:
        """Why an embedded cluster (one node, no custom resources) cannot place the replicas."""
        names = sorted({n for entry in self.spec.placement.replica_resources for n in entry})
        if not names:
            return None
        return (
            "spec.placement.replicaResources: the embedded Ray cluster offers no custom "
            f"resources; join a cluster whose nodes offer {', '.join(names)} (--ray-address)"
        )

    def controller_config(self) -> ControllerConfig:
        """What the controller runs with, from the validated (typed) fields: nothing is parsed
        again."""
        s, pa, c = self.spec, self.spec.paged_attention, self.spec.controller
        auto_devices = DEFAULT_AUTO_DEVICES
        if pa.auto_enabled_devices is not None:
            auto_devices = frozenset(pa.auto_enabled_devices)
        desired = DesiredState(
            deployment=self.name,
            policy=pa.intent(),
            kv_budget=pa.kv_cache_memory,
            auto_devices=auto_devices,
            replicas=s.replicas,
            min_ready=s.min_ready or s.replicas,
            model=s.model.name,
            served_name=s.model.served(),
            weights=s.model.weights,
            scheduler=SchedulerIntent(
                stream_interval=s.scheduler.stream_interval,
                max_model_len=s.scheduler.max_model_len,
            ),
        )
        return ControllerConfig(
            desired=desired,
            host=c.host,
            port=c.port,
            registry_port=c.registry_port,
            health_port=c.health_port,
            http_port=c.http_port,
            cors_origins=c.http.cors_origins,
            http_plaintext=self.spec.security.plaintext_http,
            heartbeat_interval_s=c.heartbeat_interval_s,
            heartbeat_timeout_s=c.heartbeat_timeout_s,
            max_outstanding_per_worker=c.max_outstanding_per_worker,
            admission=c.admission.limits(),
            max_restarts=s.max_restarts,
        )

    def shared_kv_problem(self) -> str | None:
        """Why the replicas' shares of free memory cannot fit where they share it, were they all
        on one node, or None. CPU workers share the node's memory; GPU workers share a GPU when
        each takes less than one (1 / numGpus of them)."""
        s, r = self.spec, self.spec.resources
        if r.device is DeviceKind.CPU:
            num_sharing, pool = s.replicas, "node"
        else:
            num_sharing, pool = min(s.replicas, max(int(1 / r.num_gpus), 1)), "GPU"
        problem = overcommitted(s.paged_attention.kv_cache_memory, num_sharing, pool)
        return None if problem is None else f"spec.pagedAttention.kvCacheMemory: {problem}"

    def worker_config(self, worker_id: str, controller_address: str, host: str) -> dict[str, Any]:
        """What one worker is started with (`intentserve.worker.runtime.spec.WorkerSpec`'s
        fields), as plain data: it crosses into a Ray actor and the controller never imports the
        worker."""
        s = self.spec
        return {
            "worker_id": worker_id,
            "deployment": self.name,
            "controller_address": controller_address,
            "model": s.model.name,
            "dtype": s.model.dtype,
            "chat_template": s.model.chat_template,
            "device": s.resources.device.value,
            "device_map": list(s.resources.device_map),
            "no_kv_cache": s.resources.no_kv_cache,
            "max_model_len": s.scheduler.max_model_len,
            "max_num_seqs": s.scheduler.max_num_seqs,
            "max_num_batched_tokens": s.scheduler.max_num_batched_tokens,
            "stream_interval": s.scheduler.stream_interval,
            "num_threads": max(int(s.resources.num_cpus), 1),
            "host": host,
        }


def parse_manifest(data: object, source: str = "<manifest>") -> Manifest:
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ManifestError(source, ["the document must be a mapping (apiVersion, kind, ...)"])
    try:
        return Manifest(**data)
    except ValidationError as error:
        raise ManifestError(source, describe_validation_error(error, Manifest)) from None


def load_manifest(path: str | Path, *, one_node: bool = True) -> Manifest:
    """Read, parse and validate; `ManifestError` says what is wrong and where. `one_node`: every
    replica runs on one node (the embedded cluster), so their shares of its memory must fit."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ManifestError(source, [f"cannot read it: {error.strerror or error}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ManifestError(source, [f"not valid YAML: {error}"]) from None
    manifest = parse_manifest(data, source)
    problem = (
        (manifest.shared_kv_problem() or manifest.embedded_placement_problem())
        if one_node
        else None
    )
    if problem is not None:
        raise ManifestError(source, [problem])
    return manifest
