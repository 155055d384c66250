"""`intentserve router` as its own process against a controller with TLS on loopback (scripted
workers with certificates of the deployment's CA): it gets its table with its router
certificate, streams from the workers itself over mutual TLS, answers `status` as a router, and
stops on SIGTERM, exit 0. Without a certificate to be had it refuses to start, naming why; so it
does without API keys where `up` would make one, unless told to serve inference open."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from intentserve.client import ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.common.tls import ROUTER, server_name
from intentserve.controller.auth import Security
from intentserve.controller.cli.main import main
from intentserve.controller.cli.router import router_security
from intentserve.controller.launch.client_keys import client_keys
from intentserve.controller.launch.manifest import load_manifest
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy.examples import cpu

from tests.controller.conftest import DEPLOYMENT, FAST, eventually
from tests.controller.scripted_worker import ScriptedWorker

pytestmark = pytest.mark.integration


def manifest(folder, security: str, more: str = "") -> str:
    path = folder / "router.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: intentserve/v1
            kind: Deployment
            metadata: {{name: {DEPLOYMENT}}}
            spec:
              router: {{port: 0, maxStaleS: 7}}
              security: {security}
            """
        )
        + more
    )
    return str(path)


@pytest.fixture
def secure_deployment(tmp_path):
    ca = DeploymentCa.create(DEPLOYMENT)
    cert_file, key_file = ca.write(tmp_path / "ca")
    config = dataclasses.replace(
        ControllerSettings(**FAST, paged_attention="on", replicas=1).config(),
        security=Security(ca.controller_identity(())),
    )
    server = ControllerServer(config).start()
    worker_id = config.desired.worker_ids[0]
    worker = ScriptedWorker(
        server.registry_address, worker_id, cpu(), tls=ca.issue(worker_id), deployment=DEPLOYMENT
    )
    assert worker.up().verified
    assert server.wait_until_settled(5).ready
    token_file = tmp_path / "admin-token"
    token_file.write_text("operator-token\n")
    security = f"{{caCertFile: {cert_file}, caKeyFile: {key_file}, adminTokenFile: {token_file}}}"
    yield server, worker, tmp_path, security
    worker.stop()
    server.stop(grace_s=0)


def router_process(folder, server, security: str) -> subprocess.Popen:
    """`intentserve router` with a manifest of `security`, watching `server`."""
    env = {**os.environ, "INTENTSERVE_HOME": str(folder / "home")}
    command = [sys.executable, "-m", "intentserve.controller.cli.main", "router"]
    return subprocess.Popen(
        [*command, manifest(folder, security), "--controller", server.registry_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def stopped(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate()


def test_a_router_process_serves_the_deployment_with_its_own_certificate(
    secure_deployment, capsys, monkeypatch
):
    server, worker, folder, security = secure_deployment
    monkeypatch.setenv("INTENTSERVE_HOME", str(folder / "home"))
    process = router_process(folder, server, security)
    try:
        line = process.stdout.readline()
        assert line.startswith(f"router of {DEPLOYMENT} listening on 127.0.0.1:"), (
            line or process.stderr.read()
        )
        assert "(a stale table is served for 7 s at most)" in line
        address = "127.0.0.1:" + line.split("127.0.0.1:")[1].split(",")[0]

        def status() -> tuple[int, str]:
            code = main(["status", "--controller", address])
            return code, capsys.readouterr().out

        code, out = eventually(lambda: (s := status())[1].count(": READY") and s, what="READY")
        assert code == 0 and f"from the controller at {server.registry_address}, fresh" in out
        assert main(["generate", "hi", "--controller", address, "--max-tokens", "3"]) == 0
        assert worker.num_serve_calls == 1  # the router's own call, over mutual TLS
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        stopped(process)


def test_a_router_refuses_open_inference_where_up_would_make_a_key(secure_deployment):
    """A manifest of `serve`'s shape (plaintextHttp, no apiKeysFile): `up` makes a key and asks
    for it; a router cannot know that key, so it starts only with apiKeysFile's keys."""
    server, worker, folder, security = secure_deployment
    process = router_process(folder, server, security.replace("}", ", plaintextHttp: true}"))
    try:
        line = process.stdout.readline()
        assert not line.startswith(f"router of {DEPLOYMENT} listening"), "it served: " + line
        assert process.wait(timeout=30) == 2
        err = process.stderr.read()
        assert "error: spec.security.apiKeysFile: " in err, err
        assert "spec.security.insecureOpenInference: true" in err, err
        assert worker.num_serve_calls == 0
    finally:
        stopped(process)


def test_told_to_a_router_serves_inference_open_and_says_so(secure_deployment):
    server, worker, folder, security = secure_deployment
    told = ", plaintextHttp: true, insecureOpenInference: true}"
    process = router_process(folder, server, security.replace("}", told))
    try:
        line = process.stdout.readline()
        assert line.startswith(f"router of {DEPLOYMENT} listening on 127.0.0.1:"), (
            line or process.stderr.read()
        )
        address = "127.0.0.1:" + line.split("127.0.0.1:")[1].split(",")[0]
        anyone = Credentials(DEPLOYMENT, server.config.security.tls.ca_pem, server=ROUTER)
        with ControllerClient(address, credentials=anyone) as client:
            eventually(lambda: client.health() == "serving", what="SERVING")
            chunks = list(client.generate("hi", max_tokens=3))  # no API key, no admin token
        assert chunks and chunks[-1]["finish_reason"]
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
        assert process.returncode == 0
        assert (
            "warning: spec.security.insecureOpenInference is true: this router serves inference "
            "to anyone who reaches it, with no API key"
        ) in err, err
    finally:
        stopped(process)


@pytest.mark.parametrize(
    ("security", "names"),
    [
        ("{}", "error: spec.security.adminTokenFile: a router needs the deployment's admin token"),
        ("{adminTokenFile: TOKEN}", "error: --tls-dir: a router needs a certificate of the "),
    ],
    ids=["no-admin-token", "no-certificate"],
)
def test_a_router_without_its_credentials_refuses_to_start(
    tmp_path, capsys, monkeypatch, security, names
):
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path / "home"))
    (tmp_path / "token").write_text("t\n")
    security = security.replace("TOKEN", str(tmp_path / "token"))
    code = main(["router", manifest(tmp_path, security), "--controller", "127.0.0.1:9"])
    assert code == 2
    # NOTE: an earlier test's router thread may log into this test's stderr as the test starts
    assert names in capsys.readouterr().err


def test_ca_issues_a_router_certificate_that_router_takes_from_tls_dir(tmp_path, capsys):
    folder = tmp_path / "pki"
    assert main(["ca", str(folder), "--name", DEPLOYMENT]) == 0
    assert main(["ca", str(folder), "--router"]) == 2
    assert "--router needs --deployment NAME" in capsys.readouterr().err
    assert main(["ca", str(folder), "--router", "--deployment", DEPLOYMENT]) == 0
    assert (folder / "router.key").stat().st_mode & 0o777 == 0o600
    (tmp_path / "token").write_text("t\n")
    loaded = load_manifest(manifest(tmp_path, f"{{adminTokenFile: {tmp_path / 'token'}}}"))
    keys = client_keys(loaded.spec.security, may_make=False)
    security = router_security(loaded, "127.0.0.1:9", str(folder), keys)
    cert = x509.load_pem_x509_certificate(security.tls.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == ROUTER
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert server_name(DEPLOYMENT, ROUTER) in names.get_values_for_type(x509.DNSName)
    assert security.admin_tokens == frozenset({"t"})


def test_a_router_refuses_an_event_loop_it_does_not_know_naming_the_variable(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INTENTSERVE_EVENT_LOOP", "trio")
    folder = tmp_path / "pki"
    assert main(["ca", str(folder), "--name", DEPLOYMENT]) == 0
    assert main(["ca", str(folder), "--router", "--deployment", DEPLOYMENT]) == 0
    (tmp_path / "token").write_text("t\n")
    path = manifest(tmp_path, f"{{adminTokenFile: {tmp_path / 'token'}}}")
    code = main(["router", path, "--controller", "127.0.0.1:9", "--tls-dir", str(folder)])
    assert code == 2
    assert (
        "error: INTENTSERVE_EVENT_LOOP: invalid value 'trio'; allowed values are auto, uvloop, "
        "asyncio" in capsys.readouterr().err
    )


def test_a_router_takes_a_manifest_that_places_workers_on_several_nodes(
    tmp_path, capsys, monkeypatch
):
    """A router runs on each node of a cluster: the checks of where workers go (custom resources
    the embedded cluster lacks) are `up`'s, not its. Here it gets as far as its credentials."""
    monkeypatch.setenv("INTENTSERVE_HOME", str(tmp_path / "home"))
    placed = "  replicas: 2\n  placement: {replicaResources: [{node1: 1}, {node2: 1}]}\n"
    code = main(["router", manifest(tmp_path, "{}", placed), "--controller", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "placement" not in err
    assert "spec.security.adminTokenFile: a router needs the deployment's admin token" in err
