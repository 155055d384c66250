"""The kustomize base (deploy/k8s) and the example overlay rendered (tests/deploy/kustomize.py)
and validated as today's manifests are: Kubernetes objects in strict mode, the RayCluster against
KubeRay's CRD; every Secret and ConfigMap the pods and the ServiceMonitor name is made; the
controller drains within the pod's grace period and reads the clients' API keys from the Secret."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from intentserve.controller.launch.manifest import parse_manifest

from tests.deploy.kustomize import KustomizeError, render
from tests.deploy.test_manifest_schemas import (
    KUBERNETES_VERSIONS,
    kubernetes_errors,
    raycluster_errors,
)

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
EXAMPLE = BASE / "overlays" / "example"
SECRET_FILES = {
    "ca/ca.crt": b"CERT",
    "ca/ca.key": b"KEY",
    "api-keys.txt": b"k1\n",
    "admin-token.txt": b"t1\n",
}
# Room after the drain for the controller to kill the worker actors and exit.
SHUTDOWN_MARGIN_S = 5


@pytest.fixture(scope="module")
def example() -> list[dict]:
    return render(EXAMPLE, SECRET_FILES)


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def test_the_base_is_the_controller_the_routers_and_the_raycluster():
    objects = render(BASE)
    files = [BASE / "controller.yaml", BASE / "router.yaml", BASE / "raycluster.yaml"]
    expected = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    assert objects == expected


def test_the_example_makes_its_secrets_and_the_monitoring_in_one_namespace(example):
    assert {o["metadata"]["namespace"] for o in example} == {"intentserve"}
    secrets = {s["metadata"]["name"]: s for s in by_kind(example, "Secret")}
    assert secrets["intentserve-ca"]["type"] == "kubernetes.io/tls"
    assert set(secrets["intentserve-ca"]["data"]) == {"tls.crt", "tls.key"}
    assert base64.b64decode(secrets["intentserve-api-keys"]["data"]["keys"]) == b"k1\n"
    kinds = {o["kind"] for o in example}
    assert {"Deployment", "Service", "RayCluster", "ServiceMonitor", "PrometheusRule"} <= kinds
    maps = {m["metadata"]["name"]: m for m in by_kind(example, "ConfigMap")}
    dashboard = maps["intentserve-grafana-dashboard"]
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert maps["intentserve-ca-cert"]["data"] == {"ca.crt": "CERT"}  # the certificate alone


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_kubernetes_object_is_valid_in_strict_mode(example, version):
    builtin = [o for o in example if o["apiVersion"] in ("v1", "apps/v1")]
    assert len(builtin) >= 6
    for obj in builtin:
        assert kubernetes_errors(obj, version) == [], obj["metadata"]["name"]


def test_the_rendered_raycluster_is_valid_against_kuberays_crd(example):
    (cluster,) = by_kind(example, "RayCluster")
    assert raycluster_errors(cluster) == []


def test_everything_the_pods_and_the_scraper_name_is_rendered(example):
    made = {(o["kind"], o["metadata"]["name"]) for o in example}
    deployments = by_kind(example, "Deployment")
    assert len(deployments) == 2  # the controller's and the routers'
    for deployment in deployments:
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in made
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in made
    (monitor,) = by_kind(example, "ServiceMonitor")
    ca = monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]["configMap"]["name"]
    assert ("ConfigMap", ca) in made


def test_the_controller_drains_within_the_grace_period_and_needs_an_api_key(example):
    (deployment,) = [
        d
        for d in by_kind(example, "Deployment")
        if d["metadata"]["name"] == "intentserve-controller"
    ]
    pod = deployment["spec"]["template"]["spec"]
    config_map = next(m for m in by_kind(example, "ConfigMap") if "deployment.yaml" in m["data"])
    manifest = parse_manifest(yaml.safe_load(config_map["data"]["deployment.yaml"]))
    drain_s = manifest.spec.controller.drain_timeout_s
    assert drain_s > 2.0  # more than the local default
    assert drain_s + SHUTDOWN_MARGIN_S <= pod["terminationGracePeriodSeconds"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert manifest.spec.security.api_keys_file == f"{mounts['api-keys']}/keys"


def test_what_the_renderer_does_not_render_is_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: []\n")
    with pytest.raises(KustomizeError, match="'patches'"):
        render(tmp_path)
    with pytest.raises(KustomizeError, match="no file api-keys.txt"):
        render(EXAMPLE, {"ca/ca.crt": b"C", "ca/ca.key": b"K"})
