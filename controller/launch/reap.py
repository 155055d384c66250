"""The embedded Ray cluster's own processes, and making sure they end with it.

NOTE: `ray.init(address="local")` starts the head's processes (gcs_server, raylet, monitors) as
children of this process, and `ray.shutdown()` is meant to stop them. In one clean-clone CI run
of ~20 they were all still alive 15 s after it returned. `up` promises to leave no Ray process
behind, so whatever outlives the shutdown's grace period is killed, and named in the log.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def child_pids(parent: int | None = None) -> set[int]:
    """Live direct children of `parent` (this process by default), read from /proc."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # it exited meanwhile, or no /proc here
            continue
        if int(fields[1]) == parent:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def reap(pids: set[int], grace_s: float) -> list[int]:
    """Wait up to `grace_s` for `pids` to end, then SIGKILL the rest; the pids killed."""
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = []
    for pid in sorted(p for p in pids if _alive(p)):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            continue
    if killed:
        log.warning("embedded Ray processes outlived ray.shutdown(); killed pids %s", killed)
    return killed
