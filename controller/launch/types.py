"""What the launcher reports and is given, without importing ray: the CLI's admin commands load
these (and not the Ray launcher) so that `intentserve status` starts fast."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class LaunchError(RuntimeError):
    """Ray could not be started or joined, or the workers cannot be placed."""


@dataclass(frozen=True)
class Replica:
    """One worker actor to keep alive."""

    worker_id: str
    config: dict[str, Any]  # what the worker class is constructed with
    num_cpus: float
    num_gpus: float
    max_restarts: int  # -1: unlimited
    # NOTE: a live actor of the replica's name is adopted only when it was started with the same
    # fingerprint: the same worker settings, controller address and CA, whatever certificate it
    # holds (each `up` issues new ones). Another one is replaced.
    fingerprint: str = ""
    # Custom Ray resources its actor needs (spec.placement): where on a joined cluster it runs.
    resources: dict[str, float] = field(default_factory=dict)


class ActorState(enum.Enum):
    STARTING = "starting"  # being created or restarted: no answer yet
    RUNNING = "running"  # answered; its `status()` is in the probe
    RESTARTING = "restarting"  # died; Ray is restarting it within its budget
    DEAD = "dead"  # died with its restart budget spent (or killed for good)


@dataclass(frozen=True)
class ActorProbe:
    state: ActorState
    status: dict[str, Any] | None = None  # the worker's own status when RUNNING
    error: str = ""  # why, when DEAD
