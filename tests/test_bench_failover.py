"""bench/failover.py, one kill per case: a real controller and two worker processes, each kill
seen as NOT_SERVING by a health watch well before the heartbeat timeout."""

import pytest

from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_one_kill_per_case_is_noticed_and_recorded(tmp_path):
    result, stdout = run_bench("failover", "--kills", "1", cache=tmp_path)
    assert [k["case"] for k in result["kills"]] == ["streaming", "idle"]
    timeout_s = result["heartbeat"]["timeout_s"]
    for kill in result["kills"]:
        assert 0 < kill["seconds_to_not_serving"] < timeout_s, kill
    assert set(result["summary"]) == {"streaming", "idle"}
    assert "streaming: NOT_SERVING after median" in stdout
