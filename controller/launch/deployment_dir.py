"""The deployment's state directory: what outlives one `up` process, so that the next `up` of the
deployment can take over its live workers, and what tells a second `up` that one is running.

    $INTENTSERVE_HOME/deployments/<name>/     (owner-only)
        lock             held (flock) by the `up` serving the deployment; the kernel lets go of
                         it when that process ends, however it ends (SIGKILL included)
        up.json          that process: pid, controller address, the port workers register on,
                         the Ray cluster it joined
        ca.crt, ca.key   the deployment's CA, when `up` made it (not the operator's caCertFile)

A clean stop (`down`, Ctrl-C, a start-up failure) kills the workers and removes the folder. A
killed `up` leaves it: its workers (detached actors on a joined cluster) keep their certificates
from this CA, so the next `up` loads the same CA and they can register with it again.

    state = DeploymentDir(home, "local")
    previous = state.claim()     # DeploymentRunning while another `up` holds it
    state.record(UpRecord(os.getpid(), address, registry_port, ray_address))
    ...
    state.remove()               # the workers are gone: nothing left to take over
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from intentserve.controller.launch.pki import DeploymentCa


class DeploymentRunning(RuntimeError):
    """Another live `up` holds the deployment; the message names it and how to stop it."""


@dataclass(frozen=True)
class UpRecord:
    """The `up` process that runs (or ran) the deployment."""

    pid: int
    controller_address: str  # where the admin CLI reaches its controller
    registry_port: int  # where its workers register (the mutual-TLS port; plaintext: the one port)
    ray_address: str | None  # the cluster it joined; None: its embedded one


class DeploymentDir:
    def __init__(self, home: Path, deployment: str) -> None:
        self.deployment = deployment
        self.path = Path(home) / "deployments" / deployment
        self._lock: int | None = None  # the lock file's descriptor while claimed

    def claim(self) -> UpRecord | None:
        """Hold the deployment for this process; the record an earlier `up` left when it ended
        without stopping its workers (killed), else None. DeploymentRunning while a live
        process holds it."""
        while self._lock is None:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.path, 0o700)  # NOTE: the CA's key is kept here
            fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DeploymentRunning(self._running_message()) from None
            if self._is_current(fd):
                self._lock = fd
            else:  # NOTE: its holder removed the folder meanwhile: claim the new one
                os.close(fd)
        return self.previous()

    def previous(self) -> UpRecord | None:
        try:
            return UpRecord(**json.loads((self.path / "up.json").read_text()))
        except (OSError, ValueError, TypeError):  # none, or not one this version wrote
            return None

    def record(self, up: UpRecord) -> None:
        """Written whole (a temporary file renamed into place), owner-only."""
        tmp = self.path / ".up.json.tmp"
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(asdict(up), indent=2) + "\n")
        os.replace(tmp, self.path / "up.json")

    def ca(self, now: datetime.datetime | None = None) -> DeploymentCa:
        """The CA kept here, or a new one written here when there is none or it has expired."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        cert_file, key_file = self.path / "ca.crt", self.path / "ca.key"
        if cert_file.is_file() and key_file.is_file():
            names = ("the deployment's kept CA certificate", "the deployment's kept CA key")
            ca = DeploymentCa.load(self.deployment, cert_file, key_file, fields=names)
            if ca.valid_until > now:
                return ca
        ca = DeploymentCa.create(self.deployment, now)
        ca.write(self.path)
        return ca

    def unlock(self) -> None:
        """Let go of the deployment, keeping what is recorded (its workers may live on)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def remove(self) -> None:
        """The deployment's workers are gone: nothing here is needed any more."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.unlock()

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path / "lock").st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _running_message(self) -> str:
        up = self.previous()
        if up is None:
            return (
                f"deployment {self.deployment!r} is already running: another `intentserve up` "
                f"is starting it (it holds {self.path / 'lock'}); stop that one first"
            )
        return (
            f"deployment {self.deployment!r} is already running: `intentserve up` pid {up.pid} "
            f"serves it, its controller at {up.controller_address}; stop it with "
            f"`intentserve down --controller {up.controller_address}` (or Ctrl-C where it "
            "runs) before starting it again, or give this one another name (metadata.name, "
            "`serve --name`)"
        )
