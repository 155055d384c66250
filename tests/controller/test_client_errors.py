"""The client library's one failure type: the blocking and the asyncio client fail a refused
Admin call, a refused health call and a refused request alike, as `ClientError` with the code
and details the server gave."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from intentserve.client import AsyncControllerClient, ClientError, ControllerClient, Credentials
from intentserve.controller.server import ControllerServer
from intentserve.controller.settings import ControllerSettings

from tests.controller.conftest import DEPLOYMENT, FAST

pytestmark = pytest.mark.integration


@pytest.fixture
def guarded(tmp_path):
    (tmp_path / "token").write_text("right\n")
    (tmp_path / "keys").write_text("key\n")
    settings = ControllerSettings(
        **FAST, admin_token_file=str(tmp_path / "token"), api_keys_file=str(tmp_path / "keys")
    )
    server = ControllerServer(settings.config()).start()
    yield server
    server.stop(grace_s=0)


def blocking(address: str, call: str):
    with ControllerClient(address, credentials=Credentials(DEPLOYMENT, None, "wrong")) as client:
        try:
            if call == "generate":
                return list(client.generate("hi", timeout_s=5))
            return client.status()
        except ClientError as error:
            return error.code(), error.details()


def asynchronous(address: str, call: str):
    async def run():
        credentials = Credentials(DEPLOYMENT, None, "wrong")
        async with AsyncControllerClient(address, credentials=credentials) as client:
            try:
                if call == "generate":
                    return [chunk async for chunk in client.generate("hi", timeout_s=5)]
                return await client.status()
            except ClientError as error:
                return error.code(), error.details()

    return asyncio.run(run())


@pytest.mark.parametrize("call", ["status", "generate"])
def test_both_clients_fail_alike_with_the_servers_status(guarded, call):
    refused = blocking(guarded.address, call)
    assert refused == asynchronous(guarded.address, call)
    assert refused[0] is grpc.StatusCode.UNAUTHENTICATED


def test_an_unreachable_server_is_a_client_error_too():
    with (
        ControllerClient("127.0.0.1:9", timeout_s=1) as client,
        pytest.raises(ClientError) as error,
    ):
        client.health()
    assert error.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
