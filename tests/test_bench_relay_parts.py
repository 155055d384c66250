"""bench/relay_parts.py: the router's own per-token parts, in one process: every token reaches
its stream, and each part's CPU per token is recorded for each round."""

from __future__ import annotations

import math

from tests.bench_script import run_bench


def test_a_tiny_run_hands_every_token_over_and_records_each_part(tmp_path):
    args = ("--streams", "4", "--tokens", "20", "--rounds", "2")
    result, stdout = run_bench("relay_parts", *args, cache=tmp_path)
    assert len(result["rounds"]) == 2  # the script checked every stream's 20 tokens
    for key in ("hand_off_us", "metrics_us"):
        each = [r[key] for r in result["rounds"]]
        assert math.isfinite(result[key]) and min(each) <= result[key] <= max(each)
    assert all(r["hand_off_us"] > 0 for r in result["rounds"])
    assert "median: hand-off" in stdout
