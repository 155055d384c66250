"""The engine's steps -> the worker's `grpc.health.v1` status.

A step that raises is a failure of the step itself (the model forward), which fails every
request of its batch; a request's own failure never counts here. One failed step says little (an
oversized batch, a transient device error), and a worker that went NOT_SERVING at once would get
no more work to prove it has recovered. So health goes NOT_SERVING only after
`FAILED_STEPS_NOT_SERVING` failed steps in a row, and back to SERVING with the next step that
succeeds (the server still takes requests meanwhile: a client or a probe request can bring it
back; a worker that never recovers is left to whoever watches its health to restart).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from grpc_health.v1 import health, health_pb2

log = logging.getLogger(__name__)

FAILED_STEPS_NOT_SERVING = 3


class StepHealth:
    """Counts failed steps in a row and publishes the verdict for every name in `names`.

    It only undoes what it did: SERVING is set again only after it set NOT_SERVING, so it never
    opens a server that has not started, and a draining server (`enter_graceful_shutdown`)
    ignores it. NOTE: called on the engine-loop thread only.
    """

    def __init__(
        self,
        servicer: health.HealthServicer,
        names: Sequence[str],
        threshold: int = FAILED_STEPS_NOT_SERVING,
        may_serve: Callable[[], bool] = lambda: True,
    ) -> None:
        """`may_serve`: False while the server is drained on purpose; then a recovered step
        leaves health NOT_SERVING."""
        self._servicer = servicer
        self._may_serve = may_serve
        self._names = tuple(names)
        self._threshold = threshold
        self._num_failed_in_a_row = 0
        self._marked_not_serving = False

    def step_failed(self) -> None:
        self._num_failed_in_a_row += 1
        if self._num_failed_in_a_row < self._threshold or self._marked_not_serving:
            return
        self._marked_not_serving = True
        log.error("%d engine steps failed in a row: health goes NOT_SERVING", self._threshold)
        self._publish(health_pb2.HealthCheckResponse.NOT_SERVING)

    def step_succeeded(self) -> None:
        self._num_failed_in_a_row = 0
        if not self._marked_not_serving:
            return
        self._marked_not_serving = False
        if self._may_serve():
            log.info("an engine step succeeded again: health goes SERVING")
            self._publish(health_pb2.HealthCheckResponse.SERVING)

    def _publish(self, status: int) -> None:
        for name in self._names:
            self._servicer.set(name, status)
