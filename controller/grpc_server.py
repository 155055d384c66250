"""The controller's gRPC servers, assembled: every service on the `grpc.aio` server (worker
registry, inference, the routers' WorkerTable, admin, `grpc.health.v1`, reflection), its
interceptors and its ports (one; two under TLS), and the health-only sync server on the plaintext
probe port. `ControllerServer` (server.py) builds the parts they serve and runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc
import grpc.aio
from grpc_health.v1 import _async as async_health
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from intentserve.common.status import AsyncErrorInterceptor
from intentserve.common.streaming import MAX_COMMAND_BYTES
from intentserve.common.tls import (
    server_credentials,
)
from intentserve.controller.auth import AuthInterceptor
from intentserve.controller.control.deployment import Deployment
from intentserve.controller.control.servicers import (
    AdminServicer,
    WorkerRegistryServicer,
    WorkerTableServicer,
)
from intentserve.controller.control.table_feed import TableFeed
from intentserve.controller.pending_calls import PENDING_CALL_LIMITS
from intentserve.controller.router.request_metrics import MeteredRouter
from intentserve.controller.router.servicer import InferenceServicer
from intentserve.controller.router.tokenize_route import TokenizeRoute
from intentserve.controller.settings import ControllerConfig
from intentserve.controller.status_codes import STATUS_CODES
from intentserve.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

SERVICE_NAMES = (
    worker_pb2.DESCRIPTOR.services_by_name["WorkerRegistry"].full_name,
    inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["WorkerTable"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


async def build_grpc_server(
    config: ControllerConfig,
    deployment: Deployment,
    metered_router: MeteredRouter,
    tokenizing: TokenizeRoute,
    table_feed: TableFeed,
    request_shutdown: Callable[[], None],
    health_servicer: async_health.HealthServicer,
) -> tuple[grpc.aio.Server, int, int]:
    """The gRPC server, made on the loop that runs it; its public and registry ports."""
    server = grpc.aio.server(
        # NOTE: authorization first: a refused call never reaches the error mapping.
        interceptors=[
            AuthInterceptor(
                config.security,
                config.desired.deployment,
                lambda: frozenset(config.desired.worker_ids),
            ),
            AsyncErrorInterceptor(STATUS_CODES),
        ],
        options=[
            ("grpc.so_reuseport", 0),  # a second controller on the port is an error
            # a GenerateMany command: a request up to MAX_REQUEST_BYTES, its key and timeout
            ("grpc.max_receive_message_length", MAX_COMMAND_BYTES),
            *PENDING_CALL_LIMITS,  # a burst of streams is taken, not cancelled at the door
        ],
    )
    worker_pb2_grpc.add_WorkerRegistryServicer_to_server(
        WorkerRegistryServicer(deployment, config.heartbeat_interval_s), server
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(
        InferenceServicer(metered_router, tokenizing), server
    )
    admin_pb2_grpc.add_WorkerTableServicer_to_server(WorkerTableServicer(table_feed), server)
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(deployment, request_shutdown), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(SERVICE_NAMES, server)
    tls = config.security.tls
    if tls is None:
        port = server.add_insecure_port(f"{config.host}:{config.port}")
        return server, port, port
    # Two ports: clients and probes need no certificate on the public one; workers
    # register on the other, where TLS itself requires a certificate of the CA.
    # NOTE: grpc's Python API cannot request an optional client certificate.
    public = server_credentials(tls, require_client_auth=False)
    mutual = server_credentials(tls, require_client_auth=True)
    port = server.add_secure_port(f"{config.host}:{config.port}", public)
    registry_port = server.add_secure_port(f"{config.host}:{config.registry_port}", mutual)
    return server, port, registry_port


def build_probe_server(
    config: ControllerConfig, probe_health: health.HealthServicer | None
) -> tuple[grpc.Server | None, int | None]:
    """Probes that speak no TLS get a port of their own, with nothing on it but health."""
    if probe_health is None:
        return None, None
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(probe_health, server)
    return server, server.add_insecure_port(f"{config.host}:{config.health_port}")
