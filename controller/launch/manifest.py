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

The sections live beside it, each with its own checks: `serving_spec` (model, resources,
placement, pagedAttention, scheduler), `controller_spec`, `router_spec`, `security_spec`; what
they all are, in `section`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from intentserve.common.addresses import is_loopback
from intentserve.controller.control.state import DesiredState, replica_ids
from intentserve.controller.launch.controller_spec import ControllerSpec
from intentserve.controller.launch.router_spec import RouterSpec
from intentserve.controller.launch.section import Section
from intentserve.controller.launch.security_spec import SecuritySpec
from intentserve.controller.launch.serving_spec import (
    ModelSpec,
    PagedAttentionSpec,
    PlacementSpec,
    ResourcesSpec,
    SchedulerSpec,
)
from intentserve.controller.launch.validation import describe_validation_error
from intentserve.controller.settings import ENV_PREFIX, ControllerConfig
from intentserve.policy import DEFAULT_AUTO_DEVICES, DeviceKind, IntentError, SchedulerIntent
from intentserve.policy.budget import overcommitted
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

API_VERSION = "intentserve/v1"
KIND = "Deployment"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ManifestError(ValueError):
    """The manifest cannot be used; `problems` has one line per invalid field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"invalid manifest {source}:\n" + "\n".join(f"  {p}" for p in problems))
        self.source = source
        self.problems = problems


class DeploymentSpec(Section):
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


class Metadata(Section):
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
            http_limits=c.http.limits(),
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
