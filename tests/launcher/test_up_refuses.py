"""`intentserve up` with a policy a worker cannot realize: it exits 1 within a bounded time with
the worker's reason, and the controller's health never said SERVING meanwhile."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client.calls import open_channel

from tests.launcher.up_process import UpProcess

MANIFEST = """\
apiVersion: intentserve/v1
kind: Deployment
metadata: {{name: refused}}
spec:
  model: {{name: {model}}}
  replicas: 1
  resources: {{device: cpu, numCpus: 1, noKvCache: {no_kv_cache}}}
  pagedAttention: {{mode: "on", kvCacheMemory: 32Mi}}
  scheduler: {{maxModelLen: 512}}
"""
BOUND_S = 90


class HealthWatch:
    """Every status `grpc.health.v1.Health/Watch` sends for the whole server, from the moment
    the controller listens until it stops."""

    def __init__(self, up: UpProcess) -> None:
        self.statuses: list[str] = []
        # NOTE: health is open, but over TLS: the CA comes from what `up` wrote when it started
        # listening, long before any worker could be verified.
        self._channel = open_channel(up.address, up.wait_credentials())
        stub = health_pb2_grpc.HealthStub(self._channel)
        self._call = stub.Watch(
            health_pb2.HealthCheckRequest(service=""), wait_for_ready=True, timeout=BOUND_S + 30
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self._call:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                self.statuses.append(name)
        except grpc.RpcError:
            pass  # the controller stopped

    def stop(self) -> list[str]:
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()
        return self.statuses


@pytest.mark.integration
@pytest.mark.parametrize(
    ("model", "no_kv_cache", "code"),
    [
        ("minilm-l6", "false", "model_has_no_kv_cache"),  # an encoder: nothing to page
        ("smollm2-135m", "true", "kv_cache_disabled"),  # a worker in no_kv_cache debug mode
    ],
)
def test_up_exits_1_with_the_reason_and_never_serves(tmp_path, model, no_kv_cache, code):
    manifest = tmp_path / "refused.yaml"
    manifest.write_text(MANIFEST.format(model=model, no_kv_cache=no_kv_cache))
    up = UpProcess(manifest, tmp_path)
    watch = HealthWatch(up)
    try:
        returncode = up.wait_exit(BOUND_S)
    finally:
        up.stop()
        statuses = watch.stop()
    elapsed_s = time.monotonic() - up.started_s
    assert returncode == 1, up.describe()
    assert elapsed_s < BOUND_S
    assert "error: the policy cannot be realized" in up.stderr
    assert f"refused-0: {code}: " in up.stderr, up.describe()
    assert "NOT_SERVING" in statuses and "SERVING" not in statuses, statuses
    assert up.ray_processes() == []
