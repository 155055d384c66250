"""The CLI's client of a running controller: Admin, Inference and health over one channel.

The one place where the CLI touches protobuf: every response becomes plain data here (the same
dicts feed the tables and `--json`). Enum values read as lower-case words ("ready", "paged"),
an unset message as None, and every other field is present with its value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from intentserve.controller.cli.credentials import Credentials
from intentserve.controller.cli.credentials import load as load_credentials
from intentserve.streaming import STREAM_READER_OPTIONS
from intentserve.tls import CONTROLLER, server_name
from intentserve.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc

DEFAULT_CONTROLLER = "127.0.0.1:50051"


def _bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _enum_word(field: FieldDescriptor, number: int) -> str:
    """`WORKER_STATE_READY` -> "ready": the name less the prefix its `*_UNSPECIFIED` value has."""
    enum_type = field.enum_type
    prefix = enum_type.values[0].name.removesuffix("UNSPECIFIED")
    value = enum_type.values_by_number.get(number)
    return value.name.removeprefix(prefix).lower() if value is not None else str(number)


def to_data(msg: Message) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.is_repeated:
            data[field.name] = [_value(field, v) for v in value]
        elif field.message_type is not None and not msg.HasField(field.name):
            data[field.name] = None
        elif field.has_presence and field.message_type is None and not msg.HasField(field.name):
            data[field.name] = None  # an `optional` scalar left unset
        else:
            data[field.name] = _value(field, value)
    return data


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_data(value)
    if field.enum_type is not None:
        return _enum_word(field, value)
    return value


def open_channel(address: str, credentials: Credentials) -> grpc.Channel:
    """TLS when a CA is known for the controller (the controller is verified by its name,
    `controller.<deployment>.intentserve`); plaintext otherwise."""
    if credentials.ca_pem is None:
        return grpc.insecure_channel(address, options=STREAM_READER_OPTIONS)
    return grpc.secure_channel(
        address,
        grpc.ssl_channel_credentials(root_certificates=credentials.ca_pem),
        options=[
            ("grpc.ssl_target_name_override", server_name(credentials.deployment, CONTROLLER)),
            *STREAM_READER_OPTIONS,
        ],
    )


class ControllerClient:
    def __init__(
        self,
        address: str = DEFAULT_CONTROLLER,
        timeout_s: float = 10.0,
        credentials: Credentials | None = None,
    ) -> None:
        """`credentials` default to what `up` wrote for `address` (and the environment)."""
        self.address = address
        self.timeout_s = timeout_s
        credentials = credentials if credentials is not None else load_credentials(address)
        self._admin_auth = _bearer(credentials.admin_token)
        self._client_auth = _bearer(credentials.api_key or credentials.admin_token)
        self._channel = open_channel(address, credentials)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._inference = inference_pb2_grpc.InferenceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def status(self) -> dict[str, Any]:
        request = admin_pb2.StatusRequest()
        return to_data(
            self._admin.Status(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def explain(self, worker_id: str) -> dict[str, Any]:
        request = admin_pb2.ExplainRequest(worker_id=worker_id)
        return to_data(
            self._admin.Explain(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def drain(self, worker_id: str, *, force: bool = False) -> dict[str, Any]:
        request = admin_pb2.DrainRequest(worker_id=worker_id, force=force)
        return to_data(
            self._admin.Drain(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def resume(self, worker_id: str) -> dict[str, Any]:
        request = admin_pb2.ResumeRequest(worker_id=worker_id)
        return to_data(
            self._admin.Resume(request, timeout=self.timeout_s, metadata=self._admin_auth)
        )

    def shutdown(self) -> None:
        self._admin.Shutdown(
            admin_pb2.ShutdownRequest(), timeout=self.timeout_s, metadata=self._admin_auth
        )

    def health(self, service: str = "") -> str:
        """ "serving", "not_serving", ... as `grpc.health.v1` reports it."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._health.Check(request, timeout=self.timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status).lower()

    def generate(
        self,
        prompt: str,
        *,
        chat: bool = False,
        max_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        timeout_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream the chunks of one generation (`text`, `token_ids`, ..., `finish_reason` last)."""
        sampling = inference_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        if seed is not None:
            sampling.seed = seed
        request = inference_pb2.GenerateRequest(
            prompt=prompt,
            chat=chat,
            sampling=sampling,
            stop=inference_pb2.StopConditions(
                max_tokens=max_tokens, stop=stop or [], ignore_eos=ignore_eos
            ),
        )
        for chunk in self._inference.Generate(
            request, timeout=timeout_s, metadata=self._client_auth
        ):
            yield to_data(chunk)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
