"""The controller's vocabulary: the desired state it holds and the observed states it tracks.

Desired state is a frozen value (the operator's intent and replica count); observed state is an
enum per worker and one for the deployment, so every state is named, never an `Optional[bool]`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import PurePath

from intentserve.policy import (
    DeviceKind,
    KvBudget,
    PagedAttentionConfig,
    SchedulerIntent,
    WeightFormat,
)

DEFAULT_MODEL = "smollm2-135m"


def served_name_of(model: str) -> str:
    """The name HTTP clients use for `model` when the manifest gives none: a short name or a
    Hugging Face id as written, a GGUF file's stem, a folder's name."""
    if model.endswith(".gguf"):
        return PurePath(model).stem
    if model.startswith(("/", "./", "../", "~")):
        return PurePath(model).name
    return model


def replica_ids(deployment: str, replicas: int) -> tuple[str, ...]:
    """`<deployment>-<i>` for i < replicas: the one rule that names a deployment's workers."""
    return tuple(f"{deployment}-{i}" for i in range(replicas))


@dataclass(frozen=True)
class DesiredState:
    """What the operator asked for; fixed for the life of the controller."""

    deployment: str
    policy: PagedAttentionConfig | None  # the resolved intent: off -> None
    kv_budget: KvBudget  # what each worker's KV cache may take, in every mode
    auto_devices: frozenset[DeviceKind]  # where `auto` enables PagedAttention
    replicas: int
    min_ready: int  # verified replicas needed before the deployment is ready
    model: str = DEFAULT_MODEL  # as the manifest names it (a short name, a path, an HF id)
    served_name: str | None = None  # what HTTP clients call it besides `model`; None: `model`
    weights: WeightFormat = WeightFormat.AUTO  # how each worker holds the projection weights
    # The scheduler settings each worker must report as written (from the manifest; a controller
    # run on its own checks none)
    scheduler: SchedulerIntent = SchedulerIntent()

    @property
    def model_names(self) -> tuple[str, ...]:
        """What a request's `model` may be: the served name first (what /v1/models lists),
        then the exact reference."""
        names = (self.served_name or self.model, self.model)
        return tuple(dict.fromkeys(names))

    @property
    def worker_ids(self) -> tuple[str, ...]:
        """The ids of the deployment's replicas, `<deployment>-<i>`: the only ones that may
        register (with TLS, each must hold the certificate of its id)."""
        return replica_ids(self.deployment, self.replicas)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.min_ready < 1:
            raise ValueError(f"min_ready must be at least 1, got {self.min_ready}")


class WorkerState(enum.Enum):
    """Observed state of one worker (the same names as `intentserve.v1.WorkerState`)."""

    REGISTERED = "registered"  # known, not yet resolved
    LOADING = "loading"  # accepted with a resolved config; loading the model
    READY = "ready"  # realized state verified; receives requests
    REJECTED = "rejected"  # cannot honour the policy; receives nothing until it registers again
    LOST = "lost"  # silent past the heartbeat timeout
    DRAINING = "draining"  # finishing its streams; receives no new requests
    SUSPECT = "suspect"  # a stream or its connection broke; receives nothing until re-checked


class DeploymentState(enum.Enum):
    PENDING = "pending"  # waiting for enough verified replicas
    READY = "ready"  # health says SERVING
    FAILED = "failed"  # a worker cannot honour a required (or `off`) policy
    DEGRADED = "degraded"  # health says SERVING (min_ready met); some worker suspect, lost or dead


class HeartbeatAction(enum.Enum):
    """What a heartbeat tells the worker to do next."""

    CONTINUE = "continue"
    REGISTER = "register"  # the controller does not know it (any more): register from scratch
    DRAIN = "drain"  # stop accepting new requests; finish running streams
