"""The one rule for the clients' API keys, as `up` (which may make the key) and a separate router
(which may not) apply it, row by row; `insecureOpenInference` refused where it does not apply;
`up` told to serve inference open makes no key and says so."""

from __future__ import annotations

import pytest
from intentserve.controller.auth import SecurityError
from intentserve.controller.launch.client_keys import KeyRule, client_keys
from intentserve.controller.launch.deployment_dir import DeploymentDir
from intentserve.controller.launch.manifest import ManifestError, parse_manifest
from intentserve.controller.launch.security import DeploymentSecurity, describe_security

HEADER = {"apiVersion": "intentserve/v1", "kind": "Deployment", "metadata": {"name": "t"}}
REFUSED = "refused"


def security_spec(tmp_path, **fields):
    if fields.pop("keys_file", False):
        (tmp_path / "keys").write_text("operator-key\n")
        fields["apiKeysFile"] = str(tmp_path / "keys")
    return parse_manifest({**HEADER, "spec": {"security": fields}}).spec.security


@pytest.mark.parametrize(
    ("fields", "rule", "up_keys", "router_keys"),
    [
        ({"keys_file": True}, KeyRule.KEYS_FILE, {"operator-key"}, {"operator-key"}),
        (
            {"keys_file": True, "plaintextHttp": True},
            KeyRule.KEYS_FILE,
            {"operator-key"},
            {"operator-key"},
        ),
        ({"plaintextHttp": True}, KeyRule.MADE_KEY, "made", REFUSED),
        (
            {"plaintextHttp": True, "insecureOpenInference": True},
            KeyRule.OPEN_BY_CHOICE,
            set(),
            set(),
        ),
        ({}, KeyRule.OPEN, set(), set()),
        ({"insecure": True}, KeyRule.OPEN, set(), set()),
    ],
    ids=["keys-file", "keys-file-plaintext-http", "plaintext-http", "told-open", "tls", "insecure"],
)
def test_up_and_a_router_follow_one_rule(tmp_path, fields, rule, up_keys, router_keys):
    spec = security_spec(tmp_path, **fields)
    made = client_keys(spec, may_make=True)
    assert made.rule is rule
    if up_keys == "made":
        assert made.made_key and made.api_keys == {made.made_key}
    else:
        assert (made.made_key, made.api_keys) == (None, up_keys)
    if router_keys == REFUSED:
        with pytest.raises(SecurityError) as refused:
            client_keys(spec, may_make=False)
        assert str(refused.value).startswith("spec.security.apiKeysFile: not set")
        assert "spec.security.insecureOpenInference: true" in str(refused.value)
    else:
        assert client_keys(spec, may_make=False).api_keys == router_keys
    warned = made.warning("this router")
    assert (warned is not None) is (rule is KeyRule.OPEN_BY_CHOICE)


@pytest.mark.parametrize(
    "fields",
    [{"insecureOpenInference": True}, {"insecureOpenInference": True, "plaintextHttp": True}],
    ids=["no-plaintext-http", "keys-file"],
)
def test_insecure_open_inference_is_refused_where_no_key_would_be_required(tmp_path, fields):
    if "plaintextHttp" in fields:
        (tmp_path / "keys").write_text("k\n")
        fields = {**fields, "apiKeysFile": str(tmp_path / "keys")}
    with pytest.raises(ManifestError) as caught:
        parse_manifest({**HEADER, "spec": {"security": fields}})
    problems = caught.value.problems
    assert any(
        p.startswith("spec.security.insecureOpenInference: only applies with plaintextHttp")
        for p in problems
    ), problems


def test_up_told_to_serve_inference_open_makes_no_key_and_says_so(tmp_path):
    security = {"plaintextHttp": True, "insecureOpenInference": True}
    manifest = parse_manifest({**HEADER, "spec": {"security": security}})
    prepared = DeploymentSecurity.prepare(manifest, DeploymentDir(tmp_path, manifest.name))
    assert prepared.api_key is None and prepared.security.admits_client(None)
    assert "INSECURE: inference open to anyone (insecureOpenInference" in describe_security(
        prepared
    )
    assert prepared.keys.warning("the controller").startswith(
        "spec.security.insecureOpenInference is true: the controller serves inference to anyone"
    )
