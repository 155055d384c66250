"""The Ray side of `intentserve up`: start an embedded Ray cluster (or join one) and keep one actor
per worker replica, with the manifest's resources and a restart budget.

The actors belong to the deployment, not to this process: detached, named by their worker ids in
the deployment's own Ray namespace (`intentserve-<name>`). When `up` is killed they live on with
their loaded models on a joined cluster, and the next `up` of the deployment finds them by name
and adopts them as they are. An embedded cluster's processes are `up`'s children and end with it
(reap.py), actors included: there a killed `up` takes its workers along.

NOTE: the only controller module that imports ray. The worker class is named by its import path
(`WORKER_CLASS`) and imported inside the actor's process by `_WorkerHost`, so the controller's
process never imports worker/ or torch, and controller/ has no `import worker` anywhere.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import time
from typing import Any

import ray
from intentserve.controller.launch.reap import child_pids, reap, reap_orphaned_ray_agents
from intentserve.controller.launch.types import ActorProbe, ActorState, LaunchError, Replica
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
)

__all__ = ["ActorProbe", "ActorState", "LaunchError", "RayLauncher", "Replica"]

log = logging.getLogger(__name__)

WORKER_CLASS = "intentserve.worker.actor:WorkerActor"
NAMESPACE_PREFIX = "intentserve-"
# In Ray's error when a new node is late: its raylet, or its GCS publishing its port.
STARTUP_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")
# NOTE: Ray waits 30 s for a new GCS to publish its port; a loaded 2-core machine (a test run
# beside other work) missed that in a fresh-clone `make test`. An embedded start waits this long
# unless the operator set the variable.
GCS_PORT_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
EMBEDDED_GCS_WAIT_S = "120"
EMBEDDED_OBJECT_STORE_BYTES = 128 << 20  # actors exchange only small status dicts
# NOTE: Ray starts its worker processes at niceness 15 by default. A worker's engine at that
# priority gives its cores up to the controller and the clients whenever they wake (every token
# of every stream), its torch threads stall at each parallel region, and served throughput
# fell to about 80% of the same engine in-process. Workers run at the controller's priority.
EMBEDDED_SYSTEM_CONFIG = {"worker_niceness": 0}
LOOPBACK = "127.0.0.1"
ADOPT_TIMEOUT_S = 30.0  # for a live actor to say what it was started with, or to end
SHUTDOWN_GRACE_S = 10.0  # then the embedded cluster's leftover processes are killed


class _WorkerHost:
    """The actor class: constructs the worker class named by `target` ("module:Class") inside the
    actor's process and forwards `status()` / `stop()` to it."""

    def __init__(self, target: str, config: dict[str, Any], fingerprint: str) -> None:
        module, _, name = target.partition(":")
        self._fingerprint = fingerprint
        self._worker = getattr(importlib.import_module(module), name)(config)

    def fingerprint(self) -> str:
        """The `Replica.fingerprint` it was started with."""
        return self._fingerprint

    def status(self) -> dict[str, Any]:
        return self._worker.status()

    def stop(self) -> dict[str, Any]:
        return self._worker.stop()


def namespace_of(deployment: str) -> str:
    """The Ray namespace of a deployment's actors."""
    return f"{NAMESPACE_PREFIX}{deployment}"


class RayLauncher:
    def __init__(
        self,
        *,
        deployment: str,
        address: str | None = None,
        num_cpus: float | None = None,
        temp_dir: str | None = None,
        log_to_driver: bool = False,
        worker_class: str = WORKER_CLASS,
    ) -> None:
        """`address` None starts an embedded cluster; anything else (`auto`, `HOST:6379`,
        `ray://HOST:10001`) joins one."""
        self.address = address
        self.namespace = namespace_of(deployment)
        self._num_cpus = num_cpus
        self._temp_dir = temp_dir
        self._log_to_driver = log_to_driver
        self._worker_class = worker_class
        self._actors: dict[str, Any] = {}
        self._head_pids: set[int] = set()  # the embedded cluster's processes (children of ours)

    @property
    def embedded(self) -> bool:
        return self.address is None

    def start(self, num_cpus: float, num_gpus: float) -> str:
        """Start or join Ray for workers that need `num_cpus` and `num_gpus` in all; a sentence
        saying which cluster, with its resources."""
        options: dict[str, Any] = {
            "namespace": self.namespace,
            "log_to_driver": self._log_to_driver,
            "include_dashboard": False,
            "logging_level": logging.WARNING,
        }
        if self.embedded:
            if self._num_cpus is None:
                self._check_host_fits(num_cpus)
            os.environ.setdefault(GCS_PORT_WAIT_ENV, EMBEDDED_GCS_WAIT_S)
            # NOTE: "local" always starts a new cluster (None would join one named by RAY_ADDRESS).
            options |= {
                "address": "local",
                "num_cpus": int(-(-(self._num_cpus or max(num_cpus, 1)) // 1)),
                "object_store_memory": EMBEDDED_OBJECT_STORE_BYTES,
                "_system_config": EMBEDDED_SYSTEM_CONFIG,
                "_temp_dir": self._temp_dir,
            }
        else:
            options["address"] = self.address
        if self.embedded:
            reap_orphaned_ray_agents()  # NOTE: a killed `up` leaves them ~60 s (reap.py)
        before = child_pids() if self.embedded else set()
        try:
            self._init(options)
        except Exception as error:
            where = "start an embedded Ray cluster" if self.embedded else f"join {self.address}"
            why = f"{type(error).__name__}: {summary(error)}"
            if error.__cause__ is not None:  # e.g. the AuthenticationError behind the refusal
                why += f" ({type(error.__cause__).__name__}: {summary(error.__cause__)})"
            raise LaunchError(f"cannot {where}: {why}") from error
        if self.embedded:
            self._head_pids = child_pids() - before
        resources = ray.cluster_resources()
        if self.embedded:  # NOTE: a joined cluster may autoscale; the start-up timeout covers it
            self._check_fits({"CPU": num_cpus, "GPU": num_gpus}, resources)
        gpus = f", {resources['GPU']:g} GPUs" if resources.get("GPU") else ""
        kind = "embedded Ray cluster" if self.embedded else f"Ray cluster at {self.address}"
        return f"{kind} ({resources.get('CPU', 0):g} CPUs{gpus})"

    def _init(self, options: dict[str, Any]) -> None:
        """ray.init, with one retry when a new embedded node is slow to come up.

        NOTE: on this 2-core machine the embedded raylet twice missed Ray's 30 s start-up deadline
        ("The current node timed out during startup") in about ten full test runs, leaving no
        raylet log at all, and once, loaded, the GCS its port file ("Timed out waiting for file
        .../gcs_server_port_..."); every other start took seconds. So a late node is shut down
        and started once more. A cluster being joined is the operator's: its errors are not retried.
        """
        try:
            ray.init(**options)
        except Exception as error:
            if not (self.embedded and any(t in str(error) for t in STARTUP_TIMEOUTS)):
                raise
            log.warning("the embedded Ray node timed out during start-up; starting it again")
            ray.shutdown()  # the half-started node's processes go first
            try:
                ray.init(**options)
            except Exception:
                ray.shutdown()
                raise

    def worker_host(self) -> str:
        """Where worker servers bind: loopback on the embedded cluster, every interface else."""
        return LOOPBACK if self.embedded else "0.0.0.0"

    def driver_host(self) -> str:
        """The address of this process's node as the cluster's nodes see it."""
        return LOOPBACK if self.embedded else ray.util.get_node_ip_address()

    def gcs_address(self) -> str:
        """What another driver passes to `ray.init(address=...)` to reach this cluster."""
        return ray.get_runtime_context().gcs_address

    def launch(self, replicas: list[Replica]) -> tuple[str, ...]:
        """One detached actor per replica, or the live one of its name (left by an `up` that was
        killed) adopted as it is; Ray restarts a dead one up to its `max_restarts`. The ids of
        those adopted."""
        host = ray.remote(_WorkerHost)
        adopted = []
        for replica in replicas:
            if self._adopt(replica):
                adopted.append(replica.worker_id)
                continue
            try:
                self._actors[replica.worker_id] = host.options(
                    name=replica.worker_id,
                    namespace=self.namespace,
                    lifetime="detached",
                    num_cpus=replica.num_cpus,
                    num_gpus=replica.num_gpus,
                    resources=replica.resources,
                    max_restarts=replica.max_restarts,
                    max_concurrency=2,  # status() answers while stop() runs
                ).remote(self._worker_class, replica.config, replica.fingerprint)
            except ValueError as error:  # e.g. the name was taken meanwhile
                raise LaunchError(f"cannot create worker {replica.worker_id}: {error}") from error
        return tuple(adopted)

    def _adopt(self, replica: Replica) -> bool:
        """Whether the live actor of the replica's name was started with its fingerprint and
        is now this launcher's; one started otherwise (another manifest, controller address or
        CA: it would never be verified) is killed, and its name freed for a new one."""
        try:
            actor = ray.get_actor(replica.worker_id, self.namespace)
        except ValueError:  # none alive in the deployment's namespace
            return False
        try:
            fingerprint = ray.get(actor.fingerprint.remote(), timeout=ADOPT_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as error:
            fingerprint = f"unknown ({type(error).__name__})"
        if fingerprint == replica.fingerprint:
            self._actors[replica.worker_id] = actor
            return True
        log.warning(
            "worker %s: its live actor was started from other settings (fingerprint %s, now "
            "%s); replacing it",
            replica.worker_id,
            fingerprint[:12],
            replica.fingerprint[:12],
        )
        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + ADOPT_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                ray.get_actor(replica.worker_id, self.namespace)
            except ValueError:  # the name is free again
                return False
            time.sleep(0.1)
        raise LaunchError(
            f"cannot replace worker {replica.worker_id}: its actor, started from other "
            f"settings, still holds the name {ADOPT_TIMEOUT_S:g} s after it was killed"
        )

    def probe(self, timeout_s: float = 0.5) -> dict[str, ActorProbe]:
        """Each actor's state (and its worker's status when it answers within the timeout)."""
        refs = {worker_id: actor.status.remote() for worker_id, actor in self._actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        probes = {}
        for worker_id, ref in refs.items():
            probes[worker_id] = (
                self._probe_one(ref) if ref in done else ActorProbe(ActorState.STARTING)
            )
        return probes

    def kill(self, worker_id: str, *, restart: bool = True) -> None:
        """Kill a worker's actor; with `restart` Ray restarts it (within its budget)."""
        ray.kill(self._actors[worker_id], no_restart=not restart)

    def shutdown(self) -> None:
        """Kill every actor for good, then leave Ray (which stops an embedded cluster)."""
        if not ray.is_initialized():
            return
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # NOTE: already dead: nothing to stop
                logging.getLogger(__name__).debug("actor already gone", exc_info=True)
        self._actors.clear()
        ray.shutdown()
        reap(self._head_pids, SHUTDOWN_GRACE_S)
        self._head_pids = set()

    def _probe_one(self, ref) -> ActorProbe:
        try:
            return ActorProbe(ActorState.RUNNING, ray.get(ref, timeout=0))
        except ActorUnavailableError:
            return ActorProbe(ActorState.RESTARTING)
        except ActorDiedError as error:
            return ActorProbe(ActorState.DEAD, error=summary(error))
        except GetTimeoutError:
            return ActorProbe(ActorState.STARTING)
        except Exception as error:  # the worker's status() raised: a broken worker, not a crash
            detail = f"its status() raised: {summary(error)}"
            return ActorProbe(ActorState.RUNNING, {"phase": "failed", "detail": detail})

    @staticmethod
    def _check_host_fits(num_cpus: float) -> None:
        """An embedded cluster is this host: it is sized to what the workers need, so more than
        the host has would be promised to them, each running as many torch threads."""
        try:
            host = len(os.sched_getaffinity(0))  # the CPUs this process may run on
        except AttributeError:  # not Linux
            host = os.cpu_count() or 1
        if num_cpus > host:
            raise LaunchError(
                f"the workers need {num_cpus:g} CPUs in all (replicas x spec.resources.numCpus) "
                f"but this host has {host} for an embedded Ray cluster: lower them, join a "
                "cluster (--ray-address), or size the embedded one anyway (--ray-num-cpus)"
            )

    @staticmethod
    def _check_fits(needs: dict[str, float], resources: dict[str, float]) -> None:
        for kind, need in needs.items():
            have = resources.get(kind, 0.0)
            if need > have:
                raise LaunchError(
                    f"the workers need {need:g} {kind}s in all (replicas x "
                    f"spec.resources.num{kind.capitalize()}s) but the embedded Ray cluster has "
                    f"{have:g}"
                )


_EXCEPTION_LINE = re.compile(r"\w+(Error|Exception|Interrupt)\b.*")


def summary(error: Exception) -> str:
    """One line from Ray's multi-line error text: the exception that ended a creation task
    (e.g. `ModuleNotFoundError: ...`), else the first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    raised = [line for line in lines[1:] if _EXCEPTION_LINE.fullmatch(line)]
    return f"{lines[0].split(',')[0]}: {raised[-1]}" if raised else lines[0]
