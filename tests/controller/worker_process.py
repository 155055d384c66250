"""A scripted worker in a process of its own, so that a test can SIGKILL it as a crash would:
its Inference server, its connections and its heartbeats all end at the same instant.

    python -m tests.controller.worker_process CONTROLLER WORKER_ID NUM_TOKENS TOKEN_DELAY_S

It registers, reports what matches its resolution, heartbeats every 0.1 s, prints `ready ADDRESS`
once verified, and serves until it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from intentserve.policy import examples

from tests.controller.scripted_worker import ScriptedWorker

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """The parent's handle: start, read its address, kill it."""

    def __init__(
        self, controller: str, worker_id: str, *, num_tokens: int = 3, token_delay_s: float = 0.0
    ) -> None:
        self.worker_id = worker_id
        argv = [controller, worker_id, str(num_tokens), str(token_delay_s)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            self.proc.kill()
            raise RuntimeError(f"worker {worker_id} did not come up: {line}")
        self.address = line[1]

    def kill(self) -> None:
        """SIGKILL: no goodbye, no graceful stop."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdout.close()


def main(controller: str, worker_id: str, num_tokens: str, token_delay_s: str) -> None:
    worker = ScriptedWorker(
        controller,
        worker_id,
        examples.cpu(),
        num_tokens=int(num_tokens),
        token_delay_s=float(token_delay_s),
    )
    if not worker.up().verified:
        raise SystemExit(f"{worker_id} was not verified")
    print(f"ready {worker.address}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:])
