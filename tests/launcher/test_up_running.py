"""`intentserve up` on a deployment that is already running: it names the running `up` and how to
stop it, exits 1, and starts nothing (no controller, no Ray)."""

from __future__ import annotations

import socket

from intentserve.controller.cli.main import main
from intentserve.controller.launch import launcher
from intentserve.controller.launch.deployment_dir import DeploymentDir, UpRecord


class _NoRay:
    def __init__(self, **_options) -> None:
        raise AssertionError("a refused `up` must not start Ray")


def test_up_on_a_running_deployment_names_it_and_exits_1(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path))
    monkeypatch.setattr(launcher, "RayLauncher", _NoRay)
    running = DeploymentDir(tmp_path, "local")
    running.claim()
    running.record(UpRecord(4242, "127.0.0.1:50051", 40123, None))
    assert main(["up", "deploy/local.yaml"]) == 1
    out = capsys.readouterr()
    assert out.err == (
        "error: deployment 'local' is already running: `intentserve up` pid 4242 serves it, its "
        "controller at 127.0.0.1:50051; stop it with `intentserve down --controller "
        "127.0.0.1:50051` (or Ctrl-C where it runs) before starting it again, or give this one "
        "another name (metadata.name, `serve --name`)\n"
    )
    assert out.out == ""
    assert running.previous() == UpRecord(4242, "127.0.0.1:50051", 40123, None)  # left alone
    running.unlock()


def test_a_kept_registry_port_that_is_taken_is_named(monkeypatch, tmp_path, capsys):
    """The workers a killed `up` left on a joined cluster know one registry port: the next `up`
    binds it, and says so when it cannot."""
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path))
    monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", "0")
    monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__HTTPPORT", "0")
    monkeypatch.setattr(launcher, "RayLauncher", _NoRay)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        killed = DeploymentDir(tmp_path, "local")
        killed.claim()
        killed.record(UpRecord(4242, "127.0.0.1:50051", port, "127.0.0.1:6379"))
        killed.unlock()
        assert main(["up", "deploy/local.yaml", "--ray-address", "127.0.0.1:6379"]) == 1
    err = capsys.readouterr().err
    assert (
        "error: cannot start the controller on 127.0.0.1:0 and the workers' registry port " in err
    )
    assert f"{port} (the one the workers of the killed `up` pid 4242 know)" in err
