"""bench/http_api.py, one round at a few short streams: one deployment served through the
OpenAI API (HTTPS, SSE) and through gRPC (TLS), both measured."""

import pytest

from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_one_round_streams_through_both_fronts(tmp_path):
    args = ("--rounds", "1", "--repeats", "1", "--streams", "2", "--max-tokens", "8")
    result, stdout = run_bench("http_api", *args, cache=tmp_path)
    (round_,) = result["rounds"]
    for path in ("grpc", "http"):
        assert round_[path]["tok_s"] > 0
    assert round_["http_over_grpc"] == pytest.approx(
        round_["http"]["tok_s"] / round_["grpc"]["tok_s"]
    )
    assert (result["streams"], result["max_tokens"]) == (2, 8)
    assert "HTTP reaches" in stdout
