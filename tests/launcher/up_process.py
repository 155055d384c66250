"""`intentserve up` as an operator runs it: a subprocess with its output in files, on a free
port and its own short Ray temp dir (so its Ray processes can be found, and shown gone)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from intentserve.client import ControllerClient, credentials
from intentserve.client.credentials import Credentials
from intentserve.controller.launch.launcher import namespace_of

from tests.launcher.processes import processes_mentioning, short_temp_dir

INTENTSERVE = Path(sys.executable).with_name("intentserve")
# A second driver that kills one worker's actor the way `ray.kill` does; Ray then restarts it.
# NOTE: the embedded cluster uses Ray's token authentication (the token is in ~/.ray/auth_token).
KILL_ACTOR = """
import sys, ray
ray.init(address=sys.argv[1], namespace=sys.argv[3], log_to_driver=False, logging_level="ERROR")
ray.kill(ray.get_actor(sys.argv[2]), no_restart=False)
ray.shutdown()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UpProcess:
    """`intentserve up MANIFEST`, or with `command=("serve",)` `intentserve serve MODEL`;
    `extra_args` follow it."""

    def __init__(
        self,
        manifest: str | Path,
        log_dir: Path,
        *,
        command: tuple[str, ...] = ("up",),
        extra_args: tuple[str, ...] = (),
        **env_overrides: str,
    ) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_port = free_port()  # NOTE: never the manifest's 8000, which may be taken
        self.temp_dir = short_temp_dir()
        self.stdout_path, self.stderr_path = log_dir / "up.out", log_dir / "up.err"
        # NOTE: `up` joins the cluster RAY_ADDRESS names; a test that wants that passes it.
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env |= {
            "INTENTSERVE_SPEC__CONTROLLER__PORT": str(self.port),
            "INTENTSERVE_SPEC__CONTROLLER__HTTPPORT": str(self.http_port),
            **env_overrides,
        }
        self.env = env
        self.started_s = time.monotonic()
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    str(INTENTSERVE),
                    *command,
                    str(manifest),
                    "--ray-temp-dir",
                    self.temp_dir,
                    *extra_args,
                ],
                stdout=out,
                stderr=err,
                env=env,
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def describe(self) -> str:
        return f"--- up stdout ---\n{self.stdout}\n--- up stderr ---\n{self.stderr[-4000:]}"

    def tls(self) -> ssl.SSLContext:
        """The CA this `up` wrote for the CLI, which also verifies its HTTPS API."""
        return ssl.create_default_context(
            cafile=str(credentials.folder_for(self.address) / "ca.crt")
        )

    def openai_client(self, api_key: str) -> openai.OpenAI:
        """The official SDK's client of this `up`'s HTTPS API (no retries, 60 s a call)."""
        return openai.OpenAI(
            base_url=f"https://127.0.0.1:{self.http_port}/v1",
            api_key=api_key,
            http_client=openai.DefaultHttpxClient(verify=self.tls()),
            max_retries=0,
            timeout=60,
        )

    def wait_ready(self, timeout_s: float) -> dict:
        """The status once READY; fails (with up's output) if `up` exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"up exited with {self.proc.returncode}\n{self.describe()}")
            if "] READY after" in self.stdout:
                # NOTE: made now: `up` has written the CLI's credentials (CA, admin token).
                with ControllerClient(self.address, timeout_s=2) as client:
                    return client.status()
            time.sleep(0.2)
        pytest.fail(f"not READY after {timeout_s} s\n{self.describe()}")

    def wait_credentials(self, timeout_s: float = 30.0) -> Credentials:
        """What `up` writes for the CLI as soon as its controller listens."""
        deadline = time.monotonic() + timeout_s
        path = credentials.folder_for(self.address) / "credentials.json"
        while not path.is_file():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"up wrote no credentials\n{self.describe()}")
            time.sleep(0.05)
        return credentials.load(self.address)

    def registry_address(self) -> str:
        """Where workers register (the mutual-TLS port), as `up` prints it."""
        return re.search(r"workers register on (\S+?);", self.stdout).group(1)

    def gcs_address(self) -> str:
        return re.search(r"GCS at (\S+)", self.stdout).group(1)

    def kill_actor(self, worker_id: str) -> None:
        namespace = namespace_of(worker_id.rpartition("-")[0])  # ids are <deployment>-<i>
        subprocess.run(
            [sys.executable, "-c", KILL_ACTOR, self.gcs_address(), worker_id, namespace],
            env={**os.environ, "RAY_AUTH_MODE": "token"},
            check=True,
            timeout=60,
            capture_output=True,
        )

    def wait_exit(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def ray_processes(self, settle_s: float = 15.0) -> list:
        """Processes of its Ray cluster still alive after up to `settle_s`."""
        deadline = time.monotonic() + settle_s
        while processes_mentioning(self.temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        return processes_mentioning(self.temp_dir)

    def stop(self) -> None:
        """Ctrl-C, as an operator would (harder only if it does not exit); then its Ray temp
        dir goes, once no process of its cluster is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.ray_processes():
            shutil.rmtree(self.temp_dir, ignore_errors=True)
