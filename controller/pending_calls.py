"""How many calls the controller's and the routers' gRPC servers let wait before they take them,
and for how long.

NOTE: gRPC's server cancels calls it has not yet taken (CANCELLED, before any handler runs) once
more than `grpc.server.max_pending_requests` (default 1000; all past the hard limit, 3000) are
pending, and any that has waited 30 s. A Python asyncio server busy with thousands of streams
takes new calls slowly, so a burst is cut at the door: through the relay, 72-85% of a
4096-stream burst ended so (docs/scale.md). These servers take every call they are sent, and
answer load with their own admission (RESOURCE_EXHAUSTED, the queue), never a silent cancel.
"""

from __future__ import annotations

MAX_PENDING_CALLS = 1 << 16
MAX_PENDING_CALLS_HARD = 1 << 17
MAX_UNTAKEN_S = 600  # how long a call may wait to be taken

PENDING_CALL_LIMITS = (
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS_HARD),
    ("grpc.server_max_unrequested_time_in_server", MAX_UNTAKEN_S),
)
