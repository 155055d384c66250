"""One rule for which hosts are loopback (plaintext and open keys are allowed only there), used by
the manifest, `serve` and the controller's own settings alike."""

from __future__ import annotations

import pytest
from intentserve.common.addresses import is_loopback
from intentserve.controller.launch.manifest import parse_manifest
from intentserve.controller.settings import ControllerSettings

LOOPBACK = ["localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "0:0:0:0:0:0:0:1"]
NOT_LOOPBACK = ["0.0.0.0", "::", "10.0.0.1", "192.0.2.2", "example.com", "127.example.com", ""]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_other_hosts(host):
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
def test_the_controllers_settings_take_every_loopback_host_in_plaintext(host):
    """An insecure controller on ::1 is on loopback: it needs no insecure_network."""
    assert ControllerSettings(host=host, insecure=True).host == host


@pytest.mark.parametrize("host", ["127.example.com", "0.0.0.0"])
def test_the_controllers_settings_refuse_plaintext_off_loopback(host):
    with pytest.raises(ValueError, match="insecure_network"):
        ControllerSettings(host=host, insecure=True)


def test_the_manifest_and_the_settings_agree_on_every_host():
    """The manifest's plaintext HTTP check and the settings' insecure check read one rule."""
    for host in LOOPBACK + NOT_LOOPBACK:
        manifest_ok = _manifest_plaintext_ok(host)
        assert manifest_ok == is_loopback(host), host


def _manifest_plaintext_ok(host: str) -> bool:
    try:
        parse_manifest(
            {
                "apiVersion": "intentserve/v1",
                "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {
                    "model": {"name": "smollm2-135m"},
                    "controller": {"host": host},
                    "security": {"plaintextHttp": True},
                },
            }
        )
    except ValueError:
        return False
    return True
