"""Finding processes by their command line (Linux /proc), to show nothing was left behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
        except OSError:  # it exited meanwhile
            continue
        if text in cmdline:
            found.append((int(entry.name), cmdline.strip()))
    return found


def short_temp_dir() -> str:
    """A fresh Ray temp dir with a short path (Ray's unix socket paths must stay < 108 bytes)."""
    return tempfile.mkdtemp(prefix="isv-", dir="/tmp")
