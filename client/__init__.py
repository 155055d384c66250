"""The client library of a deployment: the blocking `ControllerClient` and the asyncio
`AsyncControllerClient` (the same calls: Inference, Admin, health, to a controller or a router),
their one failure type `ClientError`, and `Credentials`.

    with ControllerClient("127.0.0.1:50051") as client:          # blocking, any thread
        for chunk in client.generate("Hello", max_tokens=8): ...

    async with AsyncControllerClient("127.0.0.1:50051") as client:  # on one asyncio loop
        async for chunk in client.generate("Hello", max_tokens=8): ...

The one place where a client touches protobuf: every response becomes plain data (`to_data`).
"""

from intentserve.client.aio import DEFAULT_CONTROLLER, AsyncControllerClient
from intentserve.client.calls import ClientError
from intentserve.client.credentials import Credentials
from intentserve.client.data import to_data
from intentserve.client.requests import RequestValueError
from intentserve.client.sync import ControllerClient

__all__ = [
    "DEFAULT_CONTROLLER",
    "AsyncControllerClient",
    "ClientError",
    "ControllerClient",
    "Credentials",
    "RequestValueError",
    "to_data",
]
