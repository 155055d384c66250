"""How `intentserve up` ends when it fails after Ray started: everything is stopped, and the
error is the last thing it prints (not `stopped: ...` after it). Ray is a stand-in here."""

from __future__ import annotations

import io
import sys

from intentserve.controller.cli.main import main
from intentserve.controller.launch import launcher
from intentserve.controller.launch.types import LaunchError


class _RayThatRefusesActors:
    """Starts as an embedded cluster would, then cannot create the actors."""

    embedded = True
    shut_down = False

    def __init__(self, **_options) -> None:
        pass

    def start(self, num_cpus: float, num_gpus: float) -> str:
        return f"embedded Ray cluster ({num_cpus:g} CPUs)"

    def gcs_address(self) -> str:
        return "127.0.0.1:1"

    def worker_host(self) -> str:
        return "127.0.0.1"

    def launch(self, replicas) -> None:
        raise LaunchError(f"cannot create worker {replicas[0].worker_id}: the name is taken")

    def shutdown(self) -> None:
        type(self).shut_down = True


def test_a_failure_after_ray_started_is_the_last_line(monkeypatch, tmp_path):
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path))
    monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", "0")
    monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__HTTPPORT", "0")
    monkeypatch.setattr(launcher, "RayLauncher", _RayThatRefusesActors)
    terminal = io.StringIO()  # what a terminal shows: stdout and stderr in the order written
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["up", "deploy/local.yaml"]) == 1
    lines = terminal.getvalue().rstrip("\n").splitlines()
    assert lines[-1] == "error: cannot create worker local-0: the name is taken", lines
    assert "stopped: controller down, worker actors killed, Ray shut down" in lines[-2]
    assert terminal.getvalue().count("the name is taken") == 1
    assert _RayThatRefusesActors.shut_down
