"""An external Ray cluster for `up` to join: `ray start --head` with its own temp dir, a free GCS
port, a few CPUs and Ray's token authentication, stopped by the ids of its own processes (never
`ray stop`, which would stop every Ray cluster on the machine)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.launcher.processes import processes_mentioning, short_temp_dir
from tests.launcher.up_process import free_port

# NOTE: Ray run by this interpreter, so the cluster's workers import this checkout's intentserve.
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
OBJECT_STORE_BYTES = 128 << 20


class RayHead:
    def __init__(self, num_cpus: int, resources: dict[str, float] | None = None) -> None:
        self.port, self.client_port = free_port(), free_port()
        self.temp_dir = short_temp_dir()
        # Token authentication, as `up`'s embedded cluster has it; the token is this cluster's.
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
        self.env.pop("RAY_ADDRESS", None)
        subprocess.run(
            [
                *RAY,
                "start",
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={self.client_port}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=false",
                *_node_flags(resources),
            ],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def add_node(self, num_cpus: int, resources: dict[str, float]) -> None:
        """A second node of this cluster on this machine (`ray start --address`), offering
        `resources`; it shares the head's temp dir, so `processes()` and `stop()` cover it."""
        subprocess.run(
            [
                *RAY,
                "start",
                f"--address={self.address}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.temp_dir}",
                *_node_flags(resources),
            ],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    @property
    def address(self) -> str:
        """The GCS address as a driver on this machine names it (Ray's node IP is not loopback,
        but the GCS listens on every interface)."""
        return f"127.0.0.1:{self.port}"

    def processes(self) -> list[tuple[int, str]]:
        """Its live processes: those naming its temp dir, the children of those (agents and
        workers rename themselves) and the Ray client server (which names the GCS port)."""
        named = processes_mentioning(self.temp_dir)
        named += [
            p for p in processes_mentioning("ray.util.client.server") if f":{self.port} " in p[1]
        ]
        pids = {pid for pid, _ in named}
        children = [(pid, cmd) for pid, cmd in _all_processes() if _parent(pid) in pids]
        return sorted({*named, *children})

    def run_driver(self, script: str, *args: str, timeout_s: float = 60) -> str:
        """A Python driver run against this cluster (RAY_ADDRESS set); its stdout."""
        return subprocess.run(
            [sys.executable, "-c", script, *args],
            env={**self.env, "RAY_ADDRESS": self.address},
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        ).stdout

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to each of its processes, SIGKILL to those left after the grace; then its
        temp dir goes."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid, _ in self.processes():
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _node_flags(resources: dict[str, float] | None) -> list[str]:
    """What every node of a test's cluster is started with, and its custom resources."""
    custom = [f"--resources={json.dumps(resources)}"] if resources else []
    return ["--disable-usage-stats", *custom]


def _all_processes() -> list[tuple[int, str]]:
    return processes_mentioning("")


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # fields after "(comm)": state, ppid, ...
