"""Where the CLI finds what it needs to talk to a controller `up` started (or a router
`intentserve router` started): the CA that signed its certificate, the admin token, and which
of the two answers there. `up` writes them, owner-only (like a kubeconfig),
under `$INTENTSERVE_HOME` (default `~/.intentserve`), one folder per controller address, and
removes them when it stops.

`INTENTSERVE_ADMIN_TOKEN`, `INTENTSERVE_CA_FILE` (with `INTENTSERVE_DEPLOYMENT`, which names the
controller's certificate) and `INTENTSERVE_API_KEY` override or stand in for the file, e.g. on a
machine other than the one running `up`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from intentserve.common.tls import CONTROLLER

ENV_HOME = "INTENTSERVE_HOME"


@dataclass(frozen=True)
class Credentials:
    deployment: str = ""  # names the server's certificate (`controller.<deployment>...`)
    ca_pem: bytes | None = None  # None: plaintext (an insecure deployment)
    admin_token: str | None = None
    api_key: str | None = None  # sent on inference calls when set
    server: str = CONTROLLER  # who answers at the address: `controller`, or `router`


def home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".intentserve")


def folder_for(address: str) -> Path:
    return home() / "controllers" / address.replace(":", "_").replace("/", "_")


def save(
    address: str,
    deployment: str,
    ca_pem: bytes | None,
    admin_token: str | None,
    server: str = CONTROLLER,
) -> Path:
    """Write what the CLI needs for `address`. The CA first, then credentials.json whole (a
    temporary file, owner-only from its creation, renamed into place): a reader that finds
    credentials.json finds all of it. Without a CA, one left by an earlier controller at the same
    address is removed."""
    folder = folder_for(address)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    ca_path = folder / "ca.crt"
    if ca_pem is not None:
        ca_path.write_bytes(ca_pem)  # public: for grpcurl -cacert and the like
    else:
        ca_path.unlink(missing_ok=True)
    data = {
        "address": address,
        "deployment": deployment,
        "admin_token": admin_token,
        "server": server,
    }
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".credentials-", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, folder / "credentials.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder


def remove(address: str) -> None:
    shutil.rmtree(folder_for(address), ignore_errors=True)


def load(address: str) -> Credentials:
    """What is known for `address`: the file `up` wrote, with the environment on top."""
    folder = folder_for(address)
    saved: dict = {}
    if (folder / "credentials.json").is_file():
        saved = json.loads((folder / "credentials.json").read_text())
    ca_file = os.environ.get("INTENTSERVE_CA_FILE") or (
        folder / "ca.crt" if (folder / "ca.crt").is_file() else None
    )
    return Credentials(
        deployment=os.environ.get("INTENTSERVE_DEPLOYMENT") or saved.get("deployment", ""),
        ca_pem=Path(ca_file).read_bytes() if ca_file else None,
        admin_token=os.environ.get("INTENTSERVE_ADMIN_TOKEN") or saved.get("admin_token"),
        api_key=os.environ.get("INTENTSERVE_API_KEY") or None,
        server=saved.get("server", CONTROLLER),
    )
