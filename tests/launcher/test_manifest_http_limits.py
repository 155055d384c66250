"""The HTTP API's deadlines and connection caps as the manifest (`spec.controller.http`,
`spec.router.http`) and the controller's environment (`INTENTSERVE_HTTP_*`) take them: defaults,
what travels to the servers' configs, and each bad value refused naming its field."""

from __future__ import annotations

import re

import pytest
from intentserve.controller.auth import Security
from intentserve.controller.launch.manifest import ManifestError, parse_manifest
from intentserve.controller.launch.router_spec import router_config
from intentserve.controller.router.http.connection_limits import HttpLimits
from intentserve.controller.settings import ControllerSettings, describe_errors
from pydantic import ValidationError

HEADER = {"apiVersion": "intentserve/v1", "kind": "Deployment", "metadata": {"name": "t"}}
SET = {
    "headerTimeoutS": 2,
    "bodyTimeoutS": 3.5,
    "keepAliveTimeoutS": 1,
    "maxConnectionsPerClient": 8,
    "maxConnections": 100,
}
AS_SET = HttpLimits(2.0, 3.5, 1.0, 8, 100)


def manifest(spec: dict):
    return parse_manifest({**HEADER, "spec": spec})


def problems(spec: dict) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        manifest(spec)
    return caught.value.problems


def test_the_defaults_are_the_servers_defaults():
    m = manifest({})
    assert m.controller_config().http_limits == HttpLimits()
    assert router_config(m, "c:1", Security()).http_limits == HttpLimits()
    assert ControllerSettings(insecure=True).config().http_limits == HttpLimits()


def test_the_fields_travel_to_the_controller_and_to_a_router():
    m = manifest({"controller": {"http": SET}, "router": {"http": {"headerTimeoutS": 7}}})
    assert m.controller_config().http_limits == AS_SET
    assert router_config(m, "c:1", Security()).http_limits == HttpLimits(header_timeout_s=7.0)


@pytest.mark.parametrize(
    ("section", "field", "value", "allowed"),
    [
        ("controller", "headerTimeoutS", 0, "greater than 0"),
        ("controller", "bodyTimeoutS", -1, "greater than 0"),
        ("controller", "keepAliveTimeoutS", float("inf"), "a finite number"),
        ("controller", "maxConnectionsPerClient", 0, "greater than or equal to 1"),
        ("controller", "maxConnections", 0, "greater than or equal to 1"),
        ("controller", "maxConnections", 2.5, "a valid integer"),
        ("router", "headerTimeoutS", 0, "greater than 0"),
        ("router", "maxConnectionsPerClient", -3, "greater than or equal to 1"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_what_is_allowed(
    section, field, value, allowed
):
    (found,) = problems({section: {"http": {field: value}}})
    assert found.startswith(f"spec.{section}.http.{field}: invalid value {value!r}; "), found
    assert allowed in found


def test_a_router_has_no_cors_to_set():
    (found,) = problems({"router": {"http": {"corsOrigins": ["*"]}}})
    assert found.startswith("spec.router.http.corsOrigins: unknown field; allowed fields here")


def test_the_controllers_environment_sets_them(monkeypatch):
    names = ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s")
    names += ("max_connections_per_client", "max_connections")
    for name, value in zip(names, ("2", "3.5", "1", "8", "100"), strict=True):
        monkeypatch.setenv(f"INTENTSERVE_HTTP_{name.upper()}", value)
    assert ControllerSettings(insecure=True).config().http_limits == AS_SET


@pytest.mark.parametrize(
    ("field", "value"),
    [("http_header_timeout_s", 0), ("http_body_timeout_s", "nan"), ("http_max_connections", 0)],
)
def test_a_bad_environment_value_names_its_variable(field, value):
    with pytest.raises(ValidationError) as error:
        ControllerSettings(insecure=True, **{field: value})
    assert re.match(f"{field} \\(INTENTSERVE_{field.upper()}\\): ", describe_errors(error.value))
