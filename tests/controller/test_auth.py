"""A controller with TLS on loopback (no Ray): the probes' plaintext health port serves health
only, and the auth rules hold call by call."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.client import AsyncControllerClient, ControllerClient
from intentserve.client.credentials import Credentials
from intentserve.common.tls import TlsIdentity
from intentserve.controller.auth import Security
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.policy import examples
from intentserve.v1 import admin_pb2, admin_pb2_grpc
from intentserve.worker.runtime.registry_client import CertificateRefused, RegistryClient

from tests.controller.conftest import DEPLOYMENT, FAST

pytestmark = pytest.mark.integration
TOKEN = "operator-token"


@pytest.fixture
def secure():
    ca = DeploymentCa.create(DEPLOYMENT)
    config = dataclasses.replace(
        ControllerSettings(**FAST, health_port=0).config(),
        security=Security(ca.controller_identity(()), frozenset({TOKEN}), frozenset({"k1"})),
    )
    server = ControllerServer(config).start()
    yield server, ca
    server.stop(grace_s=0)


def test_the_health_port_is_plaintext_and_serves_health_only(secure):
    server, _ = secure
    channel = grpc.insecure_channel(f"127.0.0.1:{server.health_port}")
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.RpcError) as error:
        admin_pb2_grpc.AdminStub(channel).Shutdown(admin_pb2.ShutdownRequest(), timeout=5)
    assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert not server.wait(0)
    channel.close()


def test_the_operators_token_opens_admin_and_a_key_or_the_token_opens_inference(secure):
    server, ca = secure
    operator = ControllerClient(
        server.address, credentials=Credentials(DEPLOYMENT, ca.cert_pem, TOKEN)
    )
    assert operator.status()["deployment"] == DEPLOYMENT
    # Not ready yet, so inference is UNAVAILABLE: the key was accepted, readiness was not met.
    for credentials in (
        Credentials(DEPLOYMENT, ca.cert_pem, None, "k1"),
        Credentials(DEPLOYMENT, ca.cert_pem, TOKEN),
    ):
        client = ControllerClient(server.address, credentials=credentials)
        with pytest.raises(grpc.RpcError) as error:
            list(client.generate("hi", timeout_s=5))
        assert error.value.code() is grpc.StatusCode.UNAVAILABLE
        client.close()
    stranger = ControllerClient(
        server.address, credentials=Credentials(DEPLOYMENT, ca.cert_pem, None, "k2")
    )
    with pytest.raises(grpc.RpcError) as error:
        list(stranger.generate("hi", timeout_s=5))
    assert error.value.code() is grpc.StatusCode.UNAUTHENTICATED
    operator.shutdown()
    assert server.wait(5)
    operator.close()
    stranger.close()


def test_the_asyncio_client_speaks_tls_and_is_held_to_the_same_rules(secure):
    server, ca = secure

    async def call(credentials: Credentials, what: str):
        async with AsyncControllerClient(server.address, credentials=credentials) as client:
            try:
                if what == "status":
                    return (await client.status())["deployment"]
                return [chunk async for chunk in client.generate("hi", timeout_s=5)]
            except grpc.RpcError as error:
                return error.code()

    def run(credentials: Credentials, what: str):
        return asyncio.run(call(credentials, what))

    assert run(Credentials(DEPLOYMENT, ca.cert_pem, TOKEN), "status") == DEPLOYMENT
    assert run(Credentials(DEPLOYMENT, ca.cert_pem, None, "k1"), "status") is (
        grpc.StatusCode.UNAUTHENTICATED  # an API key opens inference only
    )
    # Not ready, so inference is UNAVAILABLE: the key was accepted, readiness was not met.
    assert run(Credentials(DEPLOYMENT, ca.cert_pem, None, "k1"), "generate") is (
        grpc.StatusCode.UNAVAILABLE
    )
    assert run(Credentials(DEPLOYMENT, ca.cert_pem, None, "k2"), "generate") is (
        grpc.StatusCode.UNAUTHENTICATED
    )
    other_ca = DeploymentCa.create(DEPLOYMENT).cert_pem  # the controller is not who it says
    assert run(Credentials(DEPLOYMENT, other_ca, TOKEN), "status") is grpc.StatusCode.UNAVAILABLE


def test_a_refused_shared_call_reports_the_refusal_every_time(secure):
    """grpc's asyncio client turns a write that meets an ended call into INTERNAL ("Internal
    error from Core"), hiding the status the controller sent. The client writes its first
    command only once the controller has accepted the call, so a refusal always reads as one
    (before, about 1 call in 15 read INTERNAL on this machine)."""
    server, ca = secure
    refused = Credentials(DEPLOYMENT, ca.cert_pem, None, "k2")

    async def one() -> tuple[grpc.StatusCode, str]:
        async with AsyncControllerClient(server.address, credentials=refused) as client:
            try:
                await anext(client.generate("hi", timeout_s=5))
            except grpc.RpcError as error:
                return error.code(), error.details()
        raise AssertionError("a refused call gave a chunk")

    async def many() -> set[tuple[grpc.StatusCode, str]]:
        return {await one() for _ in range(60)}

    assert asyncio.run(many()) == {(grpc.StatusCode.UNAUTHENTICATED, "a valid API key is required")}


def test_a_worker_whose_certificate_is_refused_is_told_why(secure, caplog):
    """grpc's Python server cannot answer a refused client certificate with a status, and sends
    no TLS alert: the handshake just ends ("Socket closed"). The worker names the likely cause,
    at once in its log and in the error it fails with."""
    server, ca = secure
    other = DeploymentCa.create(DEPLOYMENT).issue(f"{DEPLOYMENT}-0")  # the right name, another CA
    client = RegistryClient(
        server.registry_address,
        f"{DEPLOYMENT}-0",
        2.0,
        tls=TlsIdentity(ca.cert_pem, other.cert_pem, other.key_pem),
        deployment=DEPLOYMENT,
    )
    try:
        with pytest.raises(CertificateRefused) as refused:
            client.register("127.0.0.1:9", examples.cpu(), wait_s=1.0)
    finally:
        client.close()
    message = str(refused.value)
    assert message.startswith(
        f"the controller at {server.registry_address} closed the TLS handshake: it does not "
        f"accept the certificate of worker {DEPLOYMENT}-0"
    )
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].getMessage() == message
    assert not server.deployment.workers()
