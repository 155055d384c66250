"""What `up` hands the launcher so that a later `up` can adopt it: fingerprints equal for the same
deployment whatever certificates were issued, different when an adopted worker could not be
verified as it is; the registry port a killed `up`'s workers know, kept only where they live on."""

from __future__ import annotations

import dataclasses

import pytest
from intentserve.controller.launch.deployment_dir import DeploymentDir, UpRecord
from intentserve.controller.launch.manifest import parse_manifest
from intentserve.controller.launch.ray_target import RaySource, RayTarget
from intentserve.controller.launch.replicas import registry_port_kept, replicas_of
from intentserve.controller.launch.security import DeploymentSecurity

SPEC = {
    "replicas": 2,
    "resources": {"device": "cpu", "numCpus": 1},
    "pagedAttention": {"mode": "on", "kvCacheMemory": "32Mi"},
}
CONTROLLER = "127.0.0.1:40123"


def _manifest(**changes):
    return parse_manifest(
        {
            "apiVersion": "intentserve/v1",
            "kind": "Deployment",
            "metadata": {"name": "local"},
            "spec": {**SPEC, **changes},
        }
    )


def _fingerprints(manifest, state: DeploymentDir, controller: str = CONTROLLER) -> list[str]:
    prepared = DeploymentSecurity.prepare(manifest, state)
    replicas = replicas_of(manifest, controller, "127.0.0.1", prepared, "text")
    return [r.fingerprint for r in replicas]


@pytest.fixture
def state(tmp_path):
    state = DeploymentDir(tmp_path, "local")
    state.claim()
    yield state
    state.unlock()


def test_the_same_deployment_gets_the_same_fingerprints_with_new_certificates(state):
    manifest = _manifest()
    prepared = DeploymentSecurity.prepare(manifest, state)
    first = replicas_of(manifest, CONTROLLER, "127.0.0.1", prepared, "text")
    again = replicas_of(manifest, CONTROLLER, "127.0.0.1", prepared, "json")
    assert first[0].config["tls"]["key_pem"] != again[0].config["tls"]["key_pem"]
    assert [r.fingerprint for r in first] == [r.fingerprint for r in again]
    assert first[0].fingerprint != first[1].fingerprint  # each its own worker id


@pytest.mark.parametrize(
    "changes",
    [
        {"scheduler": {"maxNumSeqs": 4}},  # a worker setting
        {"pagedAttention": {"mode": "auto", "kvCacheMemory": "32Mi"}},  # the policy
        {"pagedAttention": {"mode": "on", "kvCacheMemory": "64Mi"}},  # the KV budget
        {"resources": {"device": "cpu", "numCpus": 2}},  # its resources
        {"maxRestarts": 7},
    ],
    ids=["worker-setting", "policy", "kv-budget", "resources", "restart-budget"],
)
def test_a_change_an_adopted_worker_could_not_follow_changes_the_fingerprint(state, changes):
    assert _fingerprints(_manifest(**changes), state) != _fingerprints(_manifest(), state)


def test_another_controller_address_or_ca_changes_the_fingerprint(state, tmp_path):
    same = _fingerprints(_manifest(), state)
    assert _fingerprints(_manifest(), state, "127.0.0.1:40124") != same
    other = DeploymentDir(tmp_path / "other", "local")
    other.claim()
    assert _fingerprints(_manifest(), other) != same  # another CA: its certificates are refused
    other.unlock()


def test_a_change_the_controller_alone_applies_keeps_the_fingerprint(state):
    changed = _manifest(controller={"httpPort": 8123, "drainTimeoutS": 5})
    assert _fingerprints(changed, state) == _fingerprints(_manifest(), state)


JOINED = RayTarget("127.0.0.1:6379", RaySource.FLAG)
KILLED = UpRecord(4242, "127.0.0.1:50051", 40123, "127.0.0.1:6379")


@pytest.mark.parametrize(
    ("earlier", "target", "registry_port", "kept"),
    [
        (KILLED, JOINED, 0, 40123),  # its workers may live: the port they know
        (None, JOINED, 0, 0),  # no earlier `up`
        (KILLED, RayTarget(None, RaySource.DEFAULT), 0, 0),  # embedded: they died with it
        (KILLED, RayTarget("10.0.0.9:6379", RaySource.FLAG), 0, 0),  # another cluster
        (KILLED, JOINED, 41000, 41000),  # the manifest fixes it
    ],
    ids=["joined", "first-up", "embedded", "other-cluster", "fixed"],
)
def test_the_registry_port_is_kept_only_where_the_workers_live_on(
    state, earlier, target, registry_port, kept
):
    manifest = _manifest(controller={"registryPort": registry_port})
    prepared = DeploymentSecurity.prepare(manifest, state)
    config = dataclasses.replace(manifest.controller_config(), security=prepared.security)
    assert registry_port_kept(config, earlier, target).registry_port == kept
