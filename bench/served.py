"""A deployment served by `intentserve up` in a subprocess, for benchmarks of the served path.

with Deployment(manifest, work_dir) as d:
    for chunk in d.client.generate("Hello", max_tokens=8): ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from intentserve.client import ControllerClient, credentials

INTENTSERVE = Path(sys.executable).with_name("intentserve")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deployment:
    def __init__(
        self, manifest: Path, work: Path, *, api_key: str | None = None, ready_s: float = 300.0
    ) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.http_port = free_port()
        self._manifest, self._work, self._api_key, self._ready_s = manifest, work, api_key, ready_s
        self.client: ControllerClient | None = None
        self.credentials: credentials.Credentials | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> Deployment:
        port = self.address.rsplit(":", 1)[1]
        self._log = (self._work / f"up-{port}.log").open("w")
        env = {
            **os.environ,
            "INTENTSERVE_SPEC__CONTROLLER__PORT": port,
            "INTENTSERVE_SPEC__CONTROLLER__HTTPPORT": str(self.http_port),
        }
        self._proc = subprocess.Popen(
            [str(INTENTSERVE), "up", str(self._manifest)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + self._ready_s
        log = Path(self._log.name)
        while "] READY after" not in log.read_text():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"`up {self._manifest}` did not get READY:\n{log.read_text()}")
            time.sleep(0.2)
        saved = credentials.load(self.address)
        if self._api_key is not None:
            saved = dataclasses.replace(saved, api_key=self._api_key)
        self.credentials = saved
        self.client = ControllerClient(self.address, timeout_s=30, credentials=saved)
        return self

    @property
    def pid(self) -> int:
        """The `up` process: the controller with its front ends (workers are Ray's processes)."""
        return self._proc.pid

    def controller_cpu_s(self) -> float:
        """CPU seconds the `up` process (the controller and its front ends) has used so far."""
        return cpu_s(self.pid)

    def worker_cpu_s(self) -> float:
        """CPU seconds the deployment's worker processes (Ray actors started under `up`) have
        used so far."""
        return sum(cpu_s(pid) for pid in self._worker_pids())

    def _worker_pids(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.pid]
        while todo:
            for pid in children.get(todo.pop(), []):
                todo.append(pid)
                with contextlib.suppress(OSError):
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    # NOTE: Ray titles an actor's process after its class, `ray::_WorkerHost`.
                    if title.startswith(b"ray::_WorkerHost"):
                        found.append(pid)
        return found

    def __exit__(self, *exc_info) -> None:
        if self.client is not None:
            self.client.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
