"""The worker as a Ray actor's payload. `intentserve.controller.launch.launcher` hosts it by its
import path ("intentserve.worker.actor:WorkerActor"), so the controller never imports the worker
and its process never loads torch; Ray runs this class inside the actor's own process.

Construction returns at once: the lifecycle (probe, register, load, serve) runs on a thread and
the actor stays responsive to `status()` meanwhile. A restarted actor is constructed again with
the same config and registers again under the same worker id.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from intentserve.common.logs import formatter
from intentserve.worker.runtime.lifecycle import WorkerRuntime
from intentserve.worker.runtime.spec import WorkerSpec

log = logging.getLogger(__name__)
EXIT_RESTART = 75  # the process exits with it when only a restart can recover


def _exit_for_restart(reason: str) -> None:
    """Leave the process so that Ray restarts the actor (counted against its restart budget)."""
    log.error("exiting for a restart: %s", reason)
    logging.shutdown()
    os._exit(EXIT_RESTART)


class WorkerActor:
    def __init__(self, config: dict[str, Any]) -> None:
        spec = WorkerSpec.from_dict(config)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter(spec.log_format))
        logging.basicConfig(level=logging.INFO, handlers=[handler])
        self.runtime = WorkerRuntime(spec, on_fatal=_exit_for_restart)
        self.runtime.start()

    def status(self) -> dict[str, Any]:
        """Phase ("loading", "serving", "rejected", ...), its detail, address and pid."""
        return self.runtime.status()

    def stop(self) -> dict[str, Any]:
        self.runtime.stop()
        return self.runtime.status()
