"""Every YAML file under deploy/ parses; the intentserve manifests (files, and the one embedded in
the Kubernetes ConfigMap) validate against the schema; the Kubernetes and Ray pieces fit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from intentserve.controller.launch.manifest import API_VERSION, load_manifest, parse_manifest
from intentserve.policy import DeviceKind, Mode, WeightFormat

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
YAML_FILES = sorted(DEPLOY.rglob("*.yaml"))
CONTROLLER, ROUTER = "intentserve-controller", "intentserve-router"  # their Deployments


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_object(kind: str, name: str | None = None) -> dict:
    """The one `kind` under deploy/k8s (named `name`, where there are several)."""
    found = [
        d
        for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for d in documents(p)
        if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} under deploy/k8s, found {len(found)}"
    return found[0]


def test_the_expected_files_exist():
    names = {str(p.relative_to(DEPLOY)) for p in YAML_FILES}
    assert {
        "local.yaml",
        "local-auto.yaml",
        "embeddings.yaml",
        "native.yaml",
        "gemma.yaml",
        "cuda.yaml",
        "ray/cluster.yaml",
        "ray/deployment.yaml",
        "k8s/raycluster.yaml",
        "k8s/controller.yaml",
    } <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses_and_every_intentserve_manifest_validates(path):
    docs = documents(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert isinstance(doc, dict)
        if doc.get("apiVersion") == API_VERSION:
            parse_manifest(doc, str(path))


def test_gemma_requires_paged_attention_on_a_cpu_worker_past_its_window():
    m = load_manifest(DEPLOY / "gemma.yaml")
    assert (m.spec.model.name, m.spec.resources.device) == ("gemma3-270m", DeviceKind.CPU)
    assert m.spec.paged_attention.mode is Mode.ON
    assert m.spec.scheduler.max_model_len > 512  # Gemma 3 270M's sliding window


def test_local_requires_paged_attention_on_two_cpu_workers():
    m = load_manifest(DEPLOY / "local.yaml")
    assert (m.name, m.spec.replicas, m.spec.resources.device) == ("local", 2, DeviceKind.CPU)
    assert m.spec.paged_attention.mode is Mode.ON
    assert m.spec.controller.port == 50051


def test_embeddings_serves_the_encoder_under_auto_on_its_own_ports():
    m, local = load_manifest(DEPLOY / "embeddings.yaml"), load_manifest(DEPLOY / "local.yaml")
    assert m.spec.model.name == "minilm-l6"
    assert m.spec.paged_attention.mode is Mode.AUTO  # `on` refuses: an encoder has no KV cache
    assert m.spec.controller.port != local.spec.controller.port
    assert m.spec.controller.http_port != local.spec.controller.http_port


def test_local_auto_is_local_with_auto():
    auto, local = load_manifest(DEPLOY / "local-auto.yaml"), load_manifest(DEPLOY / "local.yaml")
    assert auto.spec.paged_attention.mode is Mode.AUTO
    assert auto.spec.resources == local.spec.resources
    assert auto.spec.scheduler == local.spec.scheduler
    assert auto.spec.controller.port != local.spec.controller.port  # both can run at once
    assert auto.spec.controller.http_port != local.spec.controller.http_port


def test_native_is_local_smollm2_held_as_its_files_blocks_on_one_worker():
    native, local = load_manifest(DEPLOY / "native.yaml"), load_manifest(DEPLOY / "local.yaml")
    assert native.spec.model.weights is WeightFormat.NATIVE
    assert (native.spec.model.name, native.spec.replicas) == (local.spec.model.name, 1)
    assert native.spec.resources == local.spec.resources
    assert native.spec.paged_attention.mode is Mode.ON
    ports = {m.spec.controller.port for m in (native, local)}
    http_ports = {m.spec.controller.http_port for m in (native, local)}
    assert len(ports) == len(http_ports) == 2  # both can run at once


def test_cuda_gives_each_worker_one_gpu_and_requires_paged_attention():
    m = load_manifest(DEPLOY / "cuda.yaml")
    assert (m.spec.resources.device, m.spec.resources.num_gpus) == (DeviceKind.CUDA, 1)
    assert m.spec.paged_attention.mode is Mode.ON


def test_the_ray_cluster_config_starts_a_head_and_workers():
    config = documents(DEPLOY / "ray" / "cluster.yaml")[0]
    assert {
        "cluster_name",
        "provider",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    } <= set(config)
    assert any("--head" in c for c in config["head_start_ray_commands"])
    cluster = load_manifest(DEPLOY / "ray" / "deployment.yaml")
    assert cluster.spec.controller.host == "0.0.0.0"  # workers on other nodes must reach it


def test_the_raycluster_is_kuberay_v1_with_a_head_and_a_worker_group():
    cluster = k8s_object("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {p["containerPort"] for p in head["ports"]} >= {6379, 10001}
    assert spec["workerGroupSpecs"] and all(
        g["template"]["spec"]["containers"] for g in spec["workerGroupSpecs"]
    )


def test_the_controller_deployment_is_ready_only_when_grpc_health_says_serving():
    deployment = k8s_object("Deployment", CONTROLLER)
    pod = deployment["spec"]["template"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    container = pod["spec"]["containers"][0]
    probe = container["readinessProbe"]["grpc"]
    assert probe["service"] == ""
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    grpc_port = ports["grpc"]
    # Kubernetes' gRPC probe speaks no TLS: it asks the plaintext, health-only port.
    assert probe["port"] == ports["health"] != grpc_port
    # It runs `intentserve up` on the ConfigMap's manifest, joining the RayCluster's head service.
    command = container["command"]
    assert command[:2] == ["intentserve", "up"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "manifest")
    config_map = k8s_object("ConfigMap")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "manifest")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    key = Path(command[2]).relative_to(mount["mountPath"]).as_posix()
    manifest = parse_manifest(yaml.safe_load(config_map["data"][key]), "ConfigMap")
    c = manifest.spec.controller
    assert (c.port, c.registry_port, c.health_port) == (grpc_port, ports["registry"], probe["port"])
    assert c.host == "0.0.0.0"
    # Security stays on: the CA comes from the Secret mounted where the manifest says.
    security = manifest.spec.security
    assert not security.insecure
    ca_mount = next(m for m in container["volumeMounts"] if m["name"] == "ca")
    ca_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "ca")
    assert ca_volume["secret"]["secretName"] == "intentserve-ca"
    for path in (security.ca_cert_file, security.ca_key_file):
        assert Path(path).parent.as_posix() == ca_mount["mountPath"]
    ray_address = command[command.index("--ray-address") + 1]
    head_service = f"{k8s_object('RayCluster')['metadata']['name']}-head-svc"
    assert re.fullmatch(rf"ray://{head_service}:10001", ray_address)


def test_the_service_routes_grpc_and_http_to_the_controller_pods():
    service = k8s_object("Service", "intentserve")
    pod_labels = k8s_object("Deployment", CONTROLLER)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["grpc", "http"]


def test_prometheus_scrapes_the_controllers_http_port():
    pod = k8s_object("Deployment", CONTROLLER)["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config_map = k8s_object("ConfigMap")
    manifest = parse_manifest(yaml.safe_load(config_map["data"]["deployment.yaml"]), "ConfigMap")
    assert (
        manifest.spec.controller.http_port
        == ports["http"]
        == int(annotations["prometheus.io/port"])
    )
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    # Security is on, so the HTTP port speaks TLS with the controller's certificate.
    assert annotations["prometheus.io/scheme"] == "https" and not manifest.spec.security.insecure


def test_make_run_brings_up_the_local_deployment():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run: (.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "Makefile has no run target"
    assert "setup" in recipe.group(1)
    assert "intentserve up $(MANIFEST)" in recipe.group(2)
    # deploy/local.yaml unless the command line names another (make run MANIFEST=...)
    assert re.search(r"^MANIFEST \?= deploy/local\.yaml$", makefile, re.M)


def test_the_routers_run_intentserve_router_on_the_manifest_watching_the_registry_service():
    """Routers are a Deployment of their own: `intentserve router` on the controller's manifest,
    watching the controller's registry port through a Service, serving where spec.router says,
    Ready when their HTTPS /health says so; their Service sends clients to them."""
    pod = k8s_object("Deployment", ROUTER)["spec"]["template"]
    container = pod["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["intentserve", "router"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "manifest")
    key = Path(command[2]).relative_to(mount["mountPath"]).as_posix()
    config_map = k8s_object("ConfigMap")
    manifest = parse_manifest(yaml.safe_load(config_map["data"][key]), "ConfigMap")
    registry = k8s_object("Service", "intentserve-registry")
    controller_labels = k8s_object("Deployment", CONTROLLER)["spec"]["template"]["metadata"]
    assert registry["spec"]["selector"].items() <= controller_labels["labels"].items()
    (port,) = registry["spec"]["ports"]
    assert port["targetPort"] == "registry"
    assert command[command.index("--controller") + 1] == (
        f"{registry['metadata']['name']}:{port['port']}"
    )
    assert port["port"] == manifest.spec.controller.registry_port
    r = manifest.spec.router
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (r.host, r.port, r.http_port) == ("0.0.0.0", ports["grpc"], ports["http"])
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"], probe["scheme"]) == ("/health", "http", "HTTPS")
    # Its certificate comes from the CA Secret; its admin token from the one the manifest names.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    security = manifest.spec.security
    assert Path(security.ca_cert_file).parent.as_posix() == mounts["ca"]
    assert Path(security.admin_token_file).parent.as_posix() == mounts["admin-token"]
    service = k8s_object("Service", ROUTER)
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["grpc", "http"]
    assert not service["spec"]["selector"].items() <= controller_labels["labels"].items()
