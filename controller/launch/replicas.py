"""What `up` hands the launcher for a deployment, made so that a later `up` can adopt it: one
`Replica` per worker id, with its own certificate and the fingerprint of what it was started
with, and the registry port its workers know.

Adoption compares fingerprints, not configs: each `up` issues new certificates, so the worker's
own key is left out; what it must agree on (the worker settings, the controller address it
registers at, the CA, its resources, and what the controller resolves for it: the policy, the
KV budget, the weight format, the scheduler settings) is in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from intentserve.controller.launch.deployment_dir import UpRecord
from intentserve.controller.launch.manifest import Manifest
from intentserve.controller.launch.ray_target import RayTarget
from intentserve.controller.launch.security import DeploymentSecurity
from intentserve.controller.launch.types import Replica
from intentserve.controller.settings import ControllerConfig


def replicas_of(
    manifest: Manifest,
    controller_address: str,
    host: str,
    prepared: DeploymentSecurity,
    log_format: str,
) -> list[Replica]:
    """One actor per replica; each is handed its own certificate and key, and no other, and
    logs in the controller's format."""
    r = manifest.spec.resources
    d = manifest.controller_config().desired
    # NOTE: a worker whose resolution changes leaves for a restart (lifecycle.py): better replaced
    resolved = repr((d.policy, d.kv_budget, sorted(k.value for k in d.auto_devices), d.weights))
    resolved += repr(d.scheduler)
    ca_pem = prepared.ca.cert_pem.decode() if prepared.ca else None
    placed = manifest.replica_resources()
    replicas = []
    for worker_id in manifest.worker_ids():
        config = manifest.worker_config(worker_id, controller_address, host)
        started_with = (
            config,
            resolved,
            ca_pem,
            r.num_cpus,
            r.num_gpus,
            manifest.spec.max_restarts,
            placed[worker_id],
        )
        replicas.append(
            Replica(
                worker_id,
                {**config, "tls": prepared.worker_tls(worker_id), "log_format": log_format},
                r.num_cpus,
                r.num_gpus,
                manifest.spec.max_restarts,
                hashlib.sha256(json.dumps(started_with, sort_keys=True).encode()).hexdigest(),
                placed[worker_id],
            )
        )
    return replicas


def registry_port_kept(
    config: ControllerConfig, earlier: UpRecord | None, ray_target: RayTarget
) -> ControllerConfig:
    """The workers' registry port as an earlier `up` of the deployment bound it, when that one
    was killed on the same joined cluster and spec.controller.registryPort is 0 (a free one):
    its workers may live on, and they know no other address. NOTE: without TLS workers register
    on spec.controller.port, which the manifest fixes (0 there cannot be adopted)."""
    if earlier is None or ray_target.embedded or earlier.ray_address != ray_target.address:
        return config
    if config.security.tls is None or config.registry_port != 0:
        return config
    return dataclasses.replace(config, registry_port=earlier.registry_port)
