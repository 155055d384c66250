"""The worker's side of `WorkerRegistry`: register, report what was realized, heartbeat.

The one module of the runtime that touches protobuf messages; callers get policy values back.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass

import grpc
from intentserve import convert
from intentserve.common.tls import CONTROLLER, TlsIdentity, secure_channel, server_name
from intentserve.policy import Capability, KvBudget, PagedAttentionConfig, Reason, Resolution
from intentserve.v1 import worker_pb2, worker_pb2_grpc
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.service.convert import heartbeat_request_to_pb
from intentserve.worker.service.engine_loop import EngineLoad

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# NOTE: a restarted worker may register before the controller sees its predecessor gone (its
# connection broken or its heartbeats lapsed); until then its id is taken: ALREADY_EXISTS.
REGISTER_RETRYABLE = (*RETRYABLE, grpc.StatusCode.ALREADY_EXISTS)


# NOTE: gRPC waits longer and longer between attempts to reconnect (up to 120 s by default): a
# controller restarted after 20 s away went unheard for ~9 s more. Its workers must find it within
# about a heartbeat, so the wait stops growing at a second (one connection attempt a second to a
# controller that is down).
CHANNEL_OPTIONS = (("grpc.max_reconnect_backoff_ms", 1000),)


class Action(enum.Enum):
    """What the controller's reply to a heartbeat asks of the worker."""

    CONTINUE = worker_pb2.HEARTBEAT_ACTION_CONTINUE
    REGISTER = worker_pb2.HEARTBEAT_ACTION_REGISTER
    DRAIN = worker_pb2.HEARTBEAT_ACTION_DRAIN


class NotRegistered(Exception):
    """The controller does not (or no longer) know this worker as loading or serving."""


class CertificateRefused(Exception):
    """The controller's registry port ended the TLS handshake: it does not accept this worker's
    certificate. NOTE: grpc's Python server can neither answer that with a status nor sends a
    TLS alert, and its own log of it is at INFO, without the peer: the client sees only
    UNAVAILABLE "Socket closed", which this names."""


class Rejected(Exception):
    """The controller refused the worker: it cannot honour a required policy."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(str(reason))
        self.reason = reason


@dataclass(frozen=True)
class Registration:
    config: PagedAttentionConfig | None  # the operator's policy, unchanged
    resolution: Resolution  # what the controller decided for this worker
    kv_budget: KvBudget  # what its KV cache may take
    heartbeat_interval_s: float
    fingerprint: bytes  # the resolved config as sent: equal bytes, equal instructions


class RegistryClient:
    def __init__(
        self,
        controller_address: str,
        worker_id: str,
        rpc_timeout_s: float,
        tls: TlsIdentity | None = None,
        deployment: str = "",
    ) -> None:
        """With `tls`, the controller is verified as the deployment's and this worker proves
        it is `worker_id` with its own certificate."""
        self.worker_id = worker_id
        self._timeout_s = rpc_timeout_s
        self._channel = (
            grpc.insecure_channel(controller_address, options=CHANNEL_OPTIONS)
            if tls is None
            else secure_channel(
                controller_address,
                tls,
                server_name(deployment, CONTROLLER),
                options=CHANNEL_OPTIONS,
            )
        )
        self._stub = worker_pb2_grpc.WorkerRegistryStub(self._channel)
        self._token = b""  # the current registration's: reports and heartbeats carry it
        self._address = controller_address
        self._tls = tls is not None

    def register(self, address: str, capability: Capability, wait_s: float) -> Registration:
        """Retry while the controller is unreachable or the id is still held by a live
        predecessor (up to `wait_s`); Rejected with the reason when it refuses the worker."""
        request = worker_pb2.RegisterRequest(
            worker_id=self.worker_id,
            address=address,
            capability=convert.capability_to_pb(capability),
            registration_token=self._token,  # NOTE: proves it is this process registering again
        )
        deadline = time.monotonic() + wait_s
        refusal: str | None = None
        while True:
            try:
                response = self._stub.Register(request, timeout=self._timeout_s)
                break
            except grpc.RpcError as error:
                if refusal is None and self._handshake_refused(error):
                    refusal = self._refusal()
                    log.warning("%s", refusal)
                if error.code() not in REGISTER_RETRYABLE or time.monotonic() > deadline:
                    if refusal is not None and self._handshake_refused(error):
                        raise CertificateRefused(refusal) from None
                    raise
                log.info(
                    "cannot register yet (%s: %s); retrying", error.code().name, error.details()
                )
                time.sleep(0.5)
        self._token = response.registration_token
        if response.WhichOneof("outcome") == "rejection":
            raise Rejected(convert.reason_from_pb(response.rejection))
        config, resolution, kv_budget = convert.resolution_from_pb(response.config)
        return Registration(
            config,
            resolution,
            kv_budget,
            response.heartbeat_interval_s,
            response.config.SerializeToString(deterministic=True),
        )

    def _handshake_refused(self, error: grpc.RpcError) -> bool:
        """An UNAVAILABLE whose connection closed during TLS: a controller that is down
        refuses the connection instead."""
        return (
            self._tls
            and error.code() is grpc.StatusCode.UNAVAILABLE
            and "Socket closed" in (error.details() or "")
        )

    def _refusal(self) -> str:
        return (
            f"the controller at {self._address} closed the TLS handshake: it does not accept the "
            f"certificate of worker {self.worker_id} (issued by another CA than the "
            "deployment's, expired, or missing); the server sends no TLS alert, so gRPC reports "
            "it as UNAVAILABLE: Socket closed"
        )

    def report_realized(self, realized: RealizedReport) -> Reason | None:
        """None when the controller verified the report, else its reason; NotRegistered when
        it forgot the worker (restarted) or counts it as lost."""
        state = convert.realized_to_pb(realized.cache)
        request = worker_pb2.RealizedReport(
            worker_id=self.worker_id, realized=state, registration_token=self._token
        )
        try:
            verification = self._stub.ReportRealized(request, timeout=self._timeout_s)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                raise NotRegistered(error.details()) from None
            raise
        if verification.verified:
            return None
        return convert.reason_from_pb(verification.reason)

    def report_load_error(self, reason: Reason) -> None:
        request = worker_pb2.RealizedReport(
            worker_id=self.worker_id,
            load_error=convert.reason_to_pb(reason),
            registration_token=self._token,
        )
        self._stub.ReportRealized(request, timeout=self._timeout_s)

    def heartbeat(self, load: EngineLoad, timeout_s: float) -> Action:
        request = heartbeat_request_to_pb(self.worker_id, load)
        request.registration_token = self._token
        return Action(self._stub.Heartbeat(request, timeout=timeout_s).action)

    def close(self) -> None:
        self._channel.close()
