"""bench/served_path.py at one stream, fp32: the in-process engine and the same engine behind
`intentserve up` (security on), the served text guarded equal to the engine's, both timed, with
the bare gRPC chain beside the engine."""

import pytest

from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_one_repeat_at_one_stream_serves_the_engines_text(tmp_path):
    args = ("--dtypes", "float32", "--concurrency", "1", "--repeats", "1", "--max-tokens", "8")
    result, stdout = run_bench("served_path", *args, cache=tmp_path, timeout=600)
    (row,) = result["rows"]
    assert (row["dtype"], row["concurrency"]) == ("float32", 1)
    assert row["engine_tok_s"] > 0 and row["served_tok_s"] > 0
    assert row["served_over_engine"] == pytest.approx(row["served_tok_s"] / row["engine_tok_s"])
    assert row["floor_engine_tok_s"] > 0  # the default client: the bare chain ran beside it
    assert "float32 n=1" in stdout
