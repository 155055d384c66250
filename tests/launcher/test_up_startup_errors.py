"""`intentserve up` start-up errors that need no Ray: they exit before anything is left behind."""

from __future__ import annotations

import socket

import pytest
from intentserve.controller.cli.main import main


def test_a_taken_port_is_exit_1_naming_it(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", str(port))
        assert main(["up", "deploy/local.yaml"]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot start the controller on 127.0.0.1:{port}" in err


def test_a_missing_manifest_is_exit_2(tmp_path, capsys):
    assert main(["up", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_a_bad_paged_attention_flag_is_exit_2_naming_the_field(monkeypatch, capsys):
    # Recorded by monkeypatch, so what the flag writes into the environment is undone afterwards.
    monkeypatch.setenv("INTENTSERVE_SPEC__PAGEDATTENTION__MODE", "on")
    assert main(["up", "deploy/local.yaml", "--paged-attention", "sometimes"]) == 2
    err = capsys.readouterr().err
    assert "spec.pagedAttention.mode" in err and "sometimes" in err
    assert "auto, on, off" in err


def test_the_paged_attention_flag_overrides_the_manifest(monkeypatch):
    from intentserve.controller.cli.up import PAGED_ATTENTION_ENV
    from intentserve.controller.launch.manifest import load_manifest

    monkeypatch.setenv(PAGED_ATTENTION_ENV, "off")  # what `--paged-attention off` sets
    assert load_manifest("deploy/local.yaml").spec.paged_attention.mode.value == "off"


def test_a_taken_http_port_is_exit_1_naming_it(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", "0")
        monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__HTTPPORT", str(port))
        assert main(["up", "deploy/local.yaml"]) == 1
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-2", "0", "0.5", "two"])
def test_a_bad_ray_num_cpus_is_exit_2_naming_the_flag_before_anything_starts(value, capsys):
    """It reached ray.init (Ray's own error, exit 1, after the controller had started)."""
    with pytest.raises(SystemExit) as exit_:
        main(["up", "deploy/local.yaml", "--ray-num-cpus", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --ray-num-cpus: {value!r}; allowed: a whole number of CPUs >= 1" in err


def test_ca_into_a_folder_it_cannot_make_is_exit_1_naming_it(tmp_path, capsys):
    """Found trying it: `intentserve ca /proc/nope` printed a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["ca", str(blocker / "ca")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write the CA to {blocker / 'ca'}: ")
    assert "Traceback" not in err
    assert main(["ca", str(tmp_path / "ok")]) == 0  # a folder it can make: written
    assert (tmp_path / "ok" / "ca.key").stat().st_mode & 0o777 == 0o600
