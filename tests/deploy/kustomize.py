"""A renderer for the kustomize features deploy/ uses, and only those (no kustomize binary
installs here): `resources` (files and folders with a kustomization), `namespace`, and
`secretGenerator` / `configMapGenerator` from files with `generatorOptions.disableNameSuffixHash`.
A kustomization that asks for anything else is refused, so that nothing is silently skipped.

    objects = render(Path("deploy/k8s/overlays/example"), provided={"ca/ca.crt": b"..."})

`provided`: the content of generator files absent from the tree (the operator's secrets), by their
path relative to the kustomization.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import yaml

RENDERED = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "secretGenerator",
    "configMapGenerator",
    "generatorOptions",
}
GENERATOR_KEYS = {"name", "type", "files", "options"}


class KustomizeError(ValueError):
    pass


def render(folder: Path, provided: dict[str, bytes] | None = None) -> list[dict]:
    provided = provided or {}
    path = folder / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    unknown = set(kustomization) - RENDERED
    if unknown:
        raise KustomizeError(f"{path}: {sorted(unknown)} are not rendered here")
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        resource = (folder / entry).resolve()
        if resource.is_dir():
            objects += render(resource)  # its generator files are in the tree
        else:
            objects += [copy.deepcopy(d) for d in yaml.safe_load_all(resource.read_text()) if d]
    options = kustomization.get("generatorOptions", {})
    generators = [
        *((g, "Secret") for g in kustomization.get("secretGenerator", [])),
        *((g, "ConfigMap") for g in kustomization.get("configMapGenerator", [])),
    ]
    if generators and set(options) - {"disableNameSuffixHash", "labels"}:
        raise KustomizeError(f"{path}: generatorOptions {sorted(options)} are not all rendered")
    if generators and not options.get("disableNameSuffixHash"):
        raise KustomizeError(f"{path}: name suffix hashes are not rendered")
    for generator, kind in generators:
        objects.append(_generate(folder, generator, kind, options.get("labels", {}), provided))
    namespace = kustomization.get("namespace")
    if namespace is not None:
        for obj in objects:
            obj["metadata"]["namespace"] = namespace
    return objects


def _generate(folder: Path, generator: dict, kind: str, labels: dict, provided) -> dict:
    unknown = set(generator) - GENERATOR_KEYS
    if unknown or set(generator.get("options", {})) - {"labels"}:
        raise KustomizeError(f"{generator['name']}: {sorted(unknown)} are not rendered")
    data = {}
    for entry in generator["files"]:
        key, _, source = entry.rpartition("=")
        file = folder / source
        content = file.read_bytes() if file.is_file() else provided.get(source)
        if content is None:
            raise KustomizeError(f"{generator['name']}: no file {source} (and none provided)")
        name = key or Path(source).name
        data[name] = base64.b64encode(content).decode() if kind == "Secret" else content.decode()
    metadata = {"name": generator["name"]}
    all_labels = {**labels, **generator.get("options", {}).get("labels", {})}
    if all_labels:
        metadata["labels"] = all_labels
    obj = {"apiVersion": "v1", "kind": kind, "metadata": metadata, "data": data}
    if kind == "Secret":
        obj["type"] = generator.get("type", "Opaque")
    return obj
