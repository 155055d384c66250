"""bench/grpc_floor.py: the bare two-hop chain delivers every message through the relay, and
says what each of its processes spent."""

from __future__ import annotations

import math

import pytest

from bench.grpc_floor import Chain, measure

pytestmark = pytest.mark.integration


def test_the_chain_streams_every_message_and_counts_each_process():
    floor = measure(messages=40, period_s=0.002, rounds=2)
    assert len(floor["rounds"]) == 2  # the client checked each round's count: 40
    for key in ("upstream_us", "relay_us", "client_us"):
        each = [r[key] for r in floor["rounds"]]
        assert math.isfinite(floor[key]) and min(each) <= floor[key] <= max(each)
        assert min(each) >= 0
    assert (floor["messages"], floor["period_s"]) == (40, 0.002)


def test_a_client_that_cannot_finish_is_an_error_not_a_figure():
    with Chain() as chain:
        client = chain.stream(messages=1000, period_s=0.01)
        client.kill()
        with pytest.raises(RuntimeError, match="the floor's client failed"):
            chain.result(client, timeout_s=10)


def test_concurrent_streams_each_get_every_message():
    floor = measure(messages=20, period_s=0.005, rounds=1, streams=8)
    assert floor["streams"] == 8  # the client checked each call's count: 20
    assert floor["relay_us"] >= 0 and floor["client_us"] >= 0
