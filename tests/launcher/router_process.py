"""`intentserve router` as an operator runs it beside a deployment: a process of its own on a free
port, its certificate from the deployment's CA folder (`intentserve ca DIR --router`), its
stderr in a file (a pipe nobody reads could fill and block its logging)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from intentserve.client import ControllerClient

from tests.launcher.up_process import INTENTSERVE


class RouterProcess:
    def __init__(
        self, deployment: str, manifest: Path, controller: str, pki: Path, env: dict, log: Path
    ) -> None:
        """`controller`: the controller's registry address (the one workers register on)."""
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [str(INTENTSERVE), "router", str(manifest), "--controller", controller]
                + ["--tls-dir", str(pki), "--port", "0"],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        line = self.proc.stdout.readline()
        listening = f"router of {deployment} listening on 127.0.0.1:"
        assert line.startswith(listening), line + log.read_text()
        self.address = "127.0.0.1:" + line.split("127.0.0.1:")[1].split(",")[0]

    def status(self) -> dict:
        with ControllerClient(self.address, timeout_s=2) as client:
            return client.status()

    def freshness(self) -> str:
        return self.status()["router"]["freshness"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
