"""Which Ray cluster `up` uses: --ray-address, else RAY_ADDRESS (as `ray job submit` sets it for
its entry point), else an embedded one; `local` asks for an embedded one; the line says why."""

from __future__ import annotations

import pytest
from intentserve.controller.launch.ray_target import RaySource, RayTarget, choose_ray_target


@pytest.mark.parametrize(
    ("flag", "environment", "address", "source"),
    [
        (None, {}, None, RaySource.DEFAULT),
        (None, {"RAY_ADDRESS": ""}, None, RaySource.DEFAULT),
        (None, {"RAY_ADDRESS": "  "}, None, RaySource.DEFAULT),
        (None, {"RAY_ADDRESS": "10.0.0.10:6379"}, "10.0.0.10:6379", RaySource.ENVIRONMENT),
        (None, {"RAY_ADDRESS": "auto"}, "auto", RaySource.ENVIRONMENT),
        (None, {"RAY_ADDRESS": "local"}, None, RaySource.ENVIRONMENT),
        ("auto", {}, "auto", RaySource.FLAG),
        ("ray://head:10001", {"RAY_ADDRESS": "10.0.0.10:6379"}, "ray://head:10001", RaySource.FLAG),
        ("local", {"RAY_ADDRESS": "10.0.0.10:6379"}, None, RaySource.FLAG),
        ("", {"RAY_ADDRESS": "10.0.0.10:6379"}, "10.0.0.10:6379", RaySource.ENVIRONMENT),
    ],
)
def test_the_flag_wins_then_ray_address_then_an_embedded_cluster(
    flag, environment, address, source
):
    target = choose_ray_target(flag, environment)
    assert target == RayTarget(address, source)
    assert target.embedded is (address is None)


@pytest.mark.parametrize(
    ("target", "line"),
    [
        (
            RayTarget(None, RaySource.DEFAULT),
            "starting an embedded cluster (no --ray-address, RAY_ADDRESS unset)",
        ),
        (RayTarget(None, RaySource.FLAG), "starting an embedded cluster (--ray-address is local)"),
        (
            RayTarget(None, RaySource.ENVIRONMENT),
            "starting an embedded cluster (RAY_ADDRESS is local)",
        ),
        (RayTarget("auto", RaySource.FLAG), "joining auto (--ray-address)"),
        (
            RayTarget("10.0.0.10:6379", RaySource.ENVIRONMENT),
            "joining 10.0.0.10:6379 (RAY_ADDRESS is set and --ray-address is not given; "
            "--ray-address local starts an embedded cluster instead)",
        ),
    ],
)
def test_the_progress_line_says_embedded_or_joined_and_why(target, line):
    assert target.describe() == line


def test_the_choice_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.10:6379")
    assert choose_ray_target(None) == RayTarget("10.0.0.10:6379", RaySource.ENVIRONMENT)
    monkeypatch.delenv("RAY_ADDRESS")
    assert choose_ray_target(None).embedded
