"""The Responses API's store size (`spec.controller.http.responsesStoreSize`,
`spec.router.http.responsesStoreSize`, the controller's `INTENTSERVE_HTTP_RESPONSES_STORE_SIZE`):
its default, what travels to the servers' configs, and a bad value refused naming its field."""

from __future__ import annotations

import pytest
from intentserve.controller.auth import Security
from intentserve.controller.launch.manifest import ManifestError, parse_manifest
from intentserve.controller.launch.router_spec import router_config
from intentserve.controller.router.http.responses_store import DEFAULT_RESPONSES_STORE_SIZE
from intentserve.controller.settings import ControllerSettings

HEADER = {"apiVersion": "intentserve/v1", "kind": "Deployment", "metadata": {"name": "t"}}


def manifest(spec: dict):
    return parse_manifest({**HEADER, "spec": spec})


def test_the_default_is_the_stores_default():
    assert DEFAULT_RESPONSES_STORE_SIZE == 256
    m = manifest({})
    assert m.controller_config().http_limits.responses_store_size == DEFAULT_RESPONSES_STORE_SIZE
    assert router_config(m, "c:1", Security()).http_limits.responses_store_size == 256
    assert ControllerSettings(insecure=True).config().http_limits.responses_store_size == 256


def test_the_field_travels_to_the_controller_and_to_a_router():
    m = manifest(
        {
            "controller": {"http": {"responsesStoreSize": 3}},
            "router": {"http": {"responsesStoreSize": 5}},
        }
    )
    assert m.controller_config().http_limits.responses_store_size == 3
    assert router_config(m, "c:1", Security()).http_limits.responses_store_size == 5


def test_the_controllers_environment_sets_it(monkeypatch):
    monkeypatch.setenv("INTENTSERVE_HTTP_RESPONSES_STORE_SIZE", "7")
    assert ControllerSettings(insecure=True).config().http_limits.responses_store_size == 7


@pytest.mark.parametrize(("section", "value"), [("controller", 0), ("router", -1)])
def test_a_bad_value_is_refused_naming_the_field(section, value):
    with pytest.raises(ManifestError) as caught:
        manifest({section: {"http": {"responsesStoreSize": value}}})
    (found,) = caught.value.problems
    assert found.startswith(f"spec.{section}.http.responsesStoreSize: invalid value {value!r}; ")
    assert "greater than or equal to 1" in found
