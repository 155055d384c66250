"""The deployment files checked as their tools check them: deploy/k8s/*.yaml against the
Kubernetes schemas in strict mode (an unknown field is an error, as with `kubectl apply
--validate=strict`), the RayCluster against KubeRay's CRD (tests/data, with unknown fields refused
as the API server's strict field validation refuses them), deploy/ray/cluster.yaml with Ray's own
config validation (what `ray up` runs). A broken copy of each fails its check."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CLUSTER_YAML = ROOT / "deploy" / "ray" / "cluster.yaml"
CRD = Path(__file__).resolve().parents[1] / "data" / "ray.io_rayclusters.yaml"
# The oldest Kubernetes with gRPC probes in GA (the controller's readiness probe), and the newest
# that kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
BUILTIN = [
    (path, doc)
    for path in sorted(K8S.glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    # NOTE: the RayCluster has its own check below; a Kustomization is kustomize's input, not an
    # object of the cluster (test_kustomize.py renders it and checks what it makes).
    if doc and not doc["apiVersion"].startswith(("ray.io/", "kustomize.config.k8s.io/"))
]


def kubernetes_errors(doc: dict, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [error.message]
    return []


def _strict(schema):
    """The CRD's structural schema with unknown fields refused where it names the fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


def _raycluster_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(v1["schema"]["openAPIV3Schema"]))


RAYCLUSTER_SCHEMA = _raycluster_validator()


def raycluster_errors(doc: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in RAYCLUSTER_SCHEMA.iter_errors(doc)
    ]


def ray_config_errors(config: dict) -> list[str]:
    """What `ray up` says of the config: Ray fills in its defaults, then validates."""
    try:
        validate_config(prepare_config(copy.deepcopy(config)))
    except (jsonschema.ValidationError, ValueError) as error:
        return [str(error).splitlines()[0]]
    return []


def raycluster() -> dict:
    return yaml.safe_load((K8S / "raycluster.yaml").read_text())


def cluster_config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("path", "doc"), BUILTIN, ids=[f"{p.name}:{d['kind']}" for p, d in BUILTIN]
)
def test_each_kubernetes_object_is_valid_in_strict_mode(path, doc, version):
    assert kubernetes_errors(doc, version) == []


def _deployment() -> dict:
    return copy.deepcopy(next(d for _, d in BUILTIN if d["kind"] == "Deployment"))


def _container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


# name: (how the copy is broken, what the check says)
Breakage = tuple[Callable[[dict], object], str]
BROKEN_DEPLOYMENTS: dict[str, Breakage] = {
    "an unknown field": (lambda d: d["spec"].update(replica=1), "'replica' was unexpected"),
    "a misspelt probe field": (
        lambda d: _container(d)["readinessProbe"].update(periodSecond=5),
        "'periodSecond' was unexpected",
    ),
    "a string where a number goes": (
        lambda d: d["spec"].update(replicas="one"),
        "'one' is not of type 'integer'",
    ),
    "a port that is no port": (
        lambda d: _container(d)["ports"][0].update(containerPort="grpc"),
        "'grpc' is not of type 'integer'",
    ),
}


@pytest.mark.parametrize(("break_it", "says"), BROKEN_DEPLOYMENTS.values(), ids=BROKEN_DEPLOYMENTS)
def test_a_broken_kubernetes_object_fails_the_check(break_it, says):
    deployment = _deployment()
    break_it(deployment)
    (error,) = kubernetes_errors(deployment, KUBERNETES_VERSIONS[-1])
    assert says in error


def test_the_raycluster_is_valid_against_kuberays_crd():
    assert raycluster_errors(raycluster()) == []


def _workers(cluster: dict) -> dict:
    return cluster["spec"]["workerGroupSpecs"][0]


BROKEN_RAYCLUSTERS: dict[str, Breakage] = {
    "a misspelt group field": (
        lambda c: _workers(c).update(minReplica=1),
        "spec.workerGroupSpecs.0: Additional properties are not allowed ('minReplica' was",
    ),
    "a misspelt spec field": (
        lambda c: c["spec"].update(enableInTreeAutoscalling=True),
        "spec: Additional properties are not allowed ('enableInTreeAutoscalling' was",
    ),
    "a number where a string goes": (
        lambda c: c["spec"].update(rayVersion=2.6),
        "spec.rayVersion: 2.6 is not of type 'string'",
    ),
    "a container field in the wrong place": (
        lambda c: _workers(c)["template"]["spec"].update(image="intentserve:0.1.0"),
        "template.spec: Additional properties are not allowed ('image' was unexpected)",
    ),
    "no head": (lambda c: c["spec"].pop("headGroupSpec"), "'headGroupSpec' is a required"),
}


@pytest.mark.parametrize(("break_it", "says"), BROKEN_RAYCLUSTERS.values(), ids=BROKEN_RAYCLUSTERS)
def test_a_broken_raycluster_fails_the_crd_check(break_it, says):
    cluster = raycluster()
    break_it(cluster)
    (error,) = raycluster_errors(cluster)
    assert says in error


def test_the_ray_cluster_config_passes_rays_own_validation():
    assert ray_config_errors(cluster_config()) == []


BROKEN_CLUSTER_CONFIGS: dict[str, Breakage] = {
    "a misspelt key": (
        lambda c: c.update(rsync_excludes=c.pop("rsync_exclude")),
        "Additional properties are not allowed ('rsync_excludes' was unexpected)",
    ),
    "a string where a list goes": (
        lambda c: c.update(rsync_exclude=".venv"),
        "'.venv' is not of type 'array'",
    ),
    "a command that is no string": (
        lambda c: c["worker_start_ray_commands"].append(42),
        "42 is not of type 'string'",
    ),
    "a boolean that is a word": (
        lambda c: c.update(file_mounts_sync_continuously="yes"),
        "'yes' is not of type 'boolean'",
    ),
}


@pytest.mark.parametrize(
    ("break_it", "says"), BROKEN_CLUSTER_CONFIGS.values(), ids=BROKEN_CLUSTER_CONFIGS
)
def test_a_broken_ray_cluster_config_fails_rays_validation(break_it, says):
    config = cluster_config()
    break_it(config)
    assert ray_config_errors(config) == [says]


def test_the_ray_cluster_syncs_the_checkout_but_no_environment_and_installs_runtime_deps_only():
    config = cluster_config()
    assert {".venv", ".git", "build", "__pycache__"} <= set(config["rsync_exclude"])
    setup = " ".join(config["setup_commands"])
    assert "make setup" not in setup and "[test]" not in setup
    assert "python3 -m venv ~/intentserve/.venv" in setup
    assert "'.[cluster]'" in setup
    head = " ".join(config["head_start_ray_commands"])
    assert "--include-dashboard=false" not in head  # `ray job submit` needs the job server
