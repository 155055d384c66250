"""spec.placement: the Ray resources that place each replica on a node of a joined cluster. What
it accepts, what it refuses (naming the field), and what each worker's actor is asked for."""

from __future__ import annotations

import textwrap

import pytest
from intentserve.controller.launch.manifest import ManifestError, load_manifest

HEADER = "apiVersion: intentserve/v1\nkind: Deployment\nmetadata: {name: t}\n"


def write(tmp_path, spec_yaml: str):
    path = tmp_path / "manifest.yaml"
    path.write_text(HEADER + textwrap.dedent(spec_yaml))
    return path


def problems(tmp_path, spec_yaml: str, *, one_node: bool = False) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        load_manifest(write(tmp_path, spec_yaml), one_node=one_node)
    return caught.value.problems


def test_each_replica_gets_its_own_entry_in_order(tmp_path):
    spec = "spec: {replicas: 2, placement: {replicaResources: [{node1: 1}, {node2: 0.5}]}}"
    manifest = load_manifest(write(tmp_path, spec), one_node=False)
    assert manifest.replica_resources() == {"t-0": {"node1": 1.0}, "t-1": {"node2": 0.5}}


def test_without_placement_no_replica_asks_for_a_custom_resource(tmp_path):
    manifest = load_manifest(write(tmp_path, "spec: {replicas: 2}"))
    assert manifest.replica_resources() == {"t-0": {}, "t-1": {}}


@pytest.mark.parametrize(
    ("spec_yaml", "expected"),
    [
        (
            "spec: {replicas: 3, placement: {replicaResources: [{node1: 1}, {node2: 1}]}}",
            "spec.placement.replicaResources: 2 entries for 3 replicas; give one per replica, "
            "in order (<name>-0, <name>-1, ...), or none",
        ),
        (
            "spec: {placement: {replicaResources: [{CPU: 1}]}}",
            "spec.placement.replicaResources: 'CPU' is set by spec.resources; entries name "
            "custom resources of the cluster's nodes (e.g. node2: 1)",
        ),
        (
            "spec: {placement: {replicaResources: [{node2: 0}]}}",
            "spec.placement.replicaResources: node2 must be more than 0, got 0",
        ),
        (
            "spec: {placement: {spread: yes}}",
            "spec.placement.spread: unknown field; allowed fields here are replicaResources",
        ),
    ],
)
def test_a_bad_placement_is_refused_naming_the_field(tmp_path, spec_yaml, expected):
    assert problems(tmp_path, spec_yaml) == [expected]


def test_the_embedded_cluster_refuses_a_placement_it_cannot_honour(tmp_path):
    spec = "spec: {replicas: 1, placement: {replicaResources: [{node2: 1}]}}"
    assert problems(tmp_path, spec, one_node=True) == [
        "spec.placement.replicaResources: the embedded Ray cluster offers no custom resources; "
        "join a cluster whose nodes offer node2 (--ray-address)"
    ]
