"""`intentserve serve MODEL` before anything starts: its flags become the manifest's fields,
`--print-manifest` writes a file `up` takes, bad flags exit 2 naming the field; and the manifest
fields it relies on (served name, plaintext HTTP on loopback only, the drain timeout)."""

from __future__ import annotations

import pytest
import yaml
from intentserve.controller.cli.main import main
from intentserve.controller.launch.deployment_dir import DeploymentDir
from intentserve.controller.launch.manifest import ManifestError, load_manifest, parse_manifest
from intentserve.controller.launch.security import DeploymentSecurity, describe_security
from intentserve.policy import DeviceKind, Mode

HEADER = {"apiVersion": "intentserve/v1", "kind": "Deployment", "metadata": {"name": "t"}}


def printed(capsys, *argv: str) -> dict:
    assert main(["serve", *argv, "--print-manifest"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_print_manifest_writes_the_defaults_and_the_flags_given(capsys):
    document = printed(capsys, "smollm2-135m")
    assert document == {
        **HEADER,
        "metadata": {"name": "serve"},
        "spec": {"model": {"name": "smollm2-135m"}, "security": {"plaintextHttp": True}},
    }
    document = printed(
        capsys,
        "smollm2-135m",
        "--paged-attention=on",
        "--replicas=2",
        "--port=50070",
        "--http-port=8010",
        "--kv-cache-memory=64Mi",
        "--drain-timeout=25",
    )
    spec = document["spec"]
    assert spec["pagedAttention"] == {"mode": "on", "kvCacheMemory": "64Mi"}
    assert spec["replicas"] == 2
    assert spec["controller"] == {"port": 50070, "httpPort": 8010, "drainTimeoutS": 25.0}


def test_the_printed_manifest_is_one_up_takes_as_it_is(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(printed(capsys, "smollm2-135m", "--paged-attention", "off")))
    manifest = load_manifest(path)
    assert manifest.spec.paged_attention.mode is Mode.OFF
    assert manifest.spec.resources.device is DeviceKind.CPU
    assert manifest.spec.security.plaintext_http
    assert manifest.controller_config().http_plaintext


def test_a_chat_template_file_given_is_read_when_the_manifest_loads(capsys, tmp_path):
    template = "tests/data/hermes_tools.jinja"
    document = printed(capsys, "gemma3-270m", "--chat-template", template)
    assert document["spec"]["model"]["chatTemplate"] == template
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(document))
    with open(template, encoding="utf-8") as source:
        assert load_manifest(path).spec.model.chat_template == source.read()


def test_a_chat_template_that_does_not_compile_exits_2_naming_the_field(capsys):
    assert main(["serve", "gemma3-270m", "--chat-template", "{% if x %}", "--print-manifest"]) == 2
    assert "spec.model.chatTemplate: " in capsys.readouterr().err


def test_off_loopback_serve_keeps_https(capsys):
    document = printed(capsys, "smollm2-135m", "--host", "0.0.0.0")
    assert "security" not in document["spec"]


def test_a_bad_flag_exits_2_naming_the_field(capsys):
    assert main(["serve", "smollm2-135m", "--paged-attention", "maybe"]) == 2
    err = capsys.readouterr().err
    assert "spec.pagedAttention.mode: invalid value 'maybe'" in err


@pytest.mark.parametrize(
    ("model", "served"),
    [
        ("smollm2-135m", "smollm2-135m"),
        ("/models/SmolLM2-135M-Instruct-Q8_0.gguf", "SmolLM2-135M-Instruct-Q8_0"),
        ("./weights/llama-folder", "llama-folder"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ],
)
def test_the_served_name_defaults_to_the_short_name_or_the_files_stem(model, served):
    manifest = parse_manifest({**HEADER, "spec": {"model": {"name": model}}})
    assert manifest.spec.model.served() == served
    desired = manifest.controller_config().desired
    assert desired.model_names == tuple(dict.fromkeys((served, model)))


def test_a_served_name_given_is_listed_first_and_the_reference_still_accepted():
    spec = {"model": {"name": "/m/x.gguf", "servedName": "my-model"}}
    desired = parse_manifest({**HEADER, "spec": spec}).controller_config().desired
    assert desired.model_names == ("my-model", "/m/x.gguf")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"controller": {"host": "0.0.0.0"}, "security": {"plaintextHttp": True}},
            "spec.security.plaintextHttp: true and the controller binds 0.0.0.0, not loopback",
        ),
        (
            {"security": {"plaintextHttp": True, "insecure": True}},
            "spec.security.plaintextHttp: true, but insecure already makes all plaintext",
        ),
        ({"controller": {"drainTimeoutS": -1}}, "spec.controller.drainTimeoutS"),
    ],
)
def test_plaintext_http_is_refused_where_it_would_be_exposed(spec, expected):
    with pytest.raises(ManifestError) as caught:
        parse_manifest({**HEADER, "spec": spec})
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_plaintext_http_without_a_keys_file_gets_a_fresh_key_never_an_open_api(tmp_path):
    spec = {"security": {"plaintextHttp": True}}
    manifest = parse_manifest({**HEADER, "spec": spec})
    state = DeploymentDir(tmp_path, manifest.name)
    first = DeploymentSecurity.prepare(manifest, state)
    second = DeploymentSecurity.prepare(manifest, state)
    assert first.api_key and first.api_key != second.api_key
    assert first.security.api_keys == {first.api_key}
    assert not first.security.admits_client(None)
    assert first.security.tls is not None  # gRPC and the workers keep TLS
    assert "HTTP in plaintext on loopback" in describe_security(first)
    (tmp_path / "keys").write_text("operator-key\n")
    spec["security"]["apiKeysFile"] = str(tmp_path / "keys")
    given = DeploymentSecurity.prepare(parse_manifest({**HEADER, "spec": spec}), state)
    assert (given.api_key, given.security.api_keys) == (None, {"operator-key"})


def test_the_drain_timeout_defaults_to_two_seconds():
    assert parse_manifest(HEADER).spec.controller.drain_timeout_s == 2.0
