"""Who may watch the controller's worker table (a controller with TLS on loopback, no Ray): a
router's certificate of this deployment or the operator's token; a worker's or the controller's
certificate, a router's of another deployment the same CA signed, a client's API key, or nothing,
is refused by name."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from intentserve.common.tls import CONTROLLER, secure_channel, server_name
from intentserve.controller.auth import Security
from intentserve.controller.launch.pki import DeploymentCa
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings
from intentserve.v1 import admin_pb2, admin_pb2_grpc

from tests.controller.conftest import DEPLOYMENT, FAST

pytestmark = pytest.mark.integration
TOKEN = "operator-token"
KEY = "client-key"
OTHER = "other-deployment"  # a deployment whose CA is this one's (an operator's shared CA)


@pytest.fixture(scope="module")
def secure():
    ca = DeploymentCa.create(DEPLOYMENT)
    config = dataclasses.replace(
        ControllerSettings(**FAST).config(),
        security=Security(ca.controller_identity(()), frozenset({TOKEN}), frozenset({KEY})),
    )
    server = ControllerServer(config).start()
    yield server, ca
    server.stop(grace_s=0)


def first_event(server, ca, holder: str | None, bearer: str | None = None):
    """The first message of a watch, or the refusal's (code, details). `holder`: whose
    certificate of the deployment's CA the caller presents (None: none, on the public port)."""
    if holder is not None:
        identity = ca.router_identity() if holder == "router" else ca.issue(holder)
        return watched(server, identity, bearer)
    channel = secure_channel(server.address, _trust_only(ca), server_name(DEPLOYMENT, CONTROLLER))
    return _first(channel, bearer)


def watched(server, identity, bearer: str | None = None):
    """`first_event` of a caller presenting `identity` on the registry port."""
    channel = secure_channel(server.registry_address, identity, server_name(DEPLOYMENT, CONTROLLER))
    return _first(channel, bearer)


def _first(channel, bearer: str | None):
    metadata = (("authorization", f"Bearer {bearer}"),) if bearer else ()
    stub = admin_pb2_grpc.WorkerTableStub(channel)
    call = stub.Watch(admin_pb2.WatchWorkersRequest(router_id="t"), timeout=5, metadata=metadata)
    try:
        return next(call)
    except grpc.RpcError as error:
        return error.code(), error.details()
    finally:
        call.cancel()
        channel.close()


def _trust_only(ca):
    """TLS that verifies the controller and presents no certificate of its own."""
    return dataclasses.replace(ca.router_identity(), cert_pem=None, key_pem=None)


def test_a_router_certificate_or_the_admin_token_gets_the_table(secure):
    server, ca = secure
    for holder, bearer in (("router", None), (None, TOKEN)):
        event = first_event(server, ca, holder, bearer)
        assert isinstance(event, admin_pb2.WorkerTableEvent), event
        assert event.snapshot and not event.ready and event.keepalive_s > 0


@pytest.mark.parametrize(
    ("holder", "bearer", "code", "names"),
    [
        (
            f"{DEPLOYMENT}-0",
            None,
            grpc.StatusCode.PERMISSION_DENIED,
            f"'{DEPLOYMENT}-0' is a worker",
        ),
        (CONTROLLER, None, grpc.StatusCode.PERMISSION_DENIED, "'controller' is not a router"),
        (None, KEY, grpc.StatusCode.UNAUTHENTICATED, "an API key is a client's, not a router's"),
        (None, None, grpc.StatusCode.UNAUTHENTICATED, "needs a router certificate"),
    ],
    ids=["worker-certificate", "controller-certificate", "client-api-key", "nothing"],
)
def test_any_other_credential_is_refused_naming_it(secure, holder, bearer, code, names):
    server, ca = secure
    refused = first_event(server, ca, holder, bearer)
    assert refused[0] is code and names in refused[1], refused


def test_a_router_certificate_of_another_deployment_of_the_same_ca_is_refused_naming_it(
    secure, tmp_path
):
    """`intentserve ca DIR --router --deployment other-deployment` with the CA this one uses:
    its name is `router`, but it is the other deployment's router."""
    server, ca = secure
    shared = DeploymentCa.load(OTHER, *ca.write(tmp_path / "shared-ca"))
    refused = watched(server, shared.router_identity())
    assert not isinstance(refused, admin_pb2.WorkerTableEvent), "the other's router got the table"
    code, details = refused
    assert code is grpc.StatusCode.PERMISSION_DENIED, details
    assert f"'router' is of deployment {OTHER!r}, not of {DEPLOYMENT!r}" in details
    own = watched(server, ca.router_identity())  # this deployment's router still gets the table
    assert isinstance(own, admin_pb2.WorkerTableEvent) and own.snapshot, own
