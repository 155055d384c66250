"""A stand-in for `intentserve.worker.actor.WorkerActor` in launcher tests: no model, answers at
once."""

from __future__ import annotations

import os
from typing import Any


class FakeWorker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def status(self) -> dict[str, Any]:
        return {
            "worker_id": self.config["worker_id"],
            "phase": "serving",
            "pid": os.getpid(),
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        }

    def stop(self) -> dict[str, Any]:
        return self.status()
