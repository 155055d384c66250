"""The embedded Ray cluster's own processes, and making sure they end with it.

NOTE: `ray.init(address="local")` starts the head's processes (gcs_server, raylet, monitors) as
children of this process, and `ray.shutdown()` is meant to stop them. In one clean-clone CI run
of ~20 they were all still alive 15 s after it returned. `up` promises to leave no Ray process
behind, so whatever outlives the shutdown's grace period is killed, and named in the log.

A SIGKILLed `up` runs no shutdown: its gcs_server and raylet end at once, but the raylet's
agents (dashboard and runtime-env) notice it gone within seconds and then spend 60 s trying to
tell the dead GCS (Ray's `publish_error_to_driver` waits that long; no setting shortens it).
The next `up` kills such orphans before it starts Ray.
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


def reap(
    pids: set[int], grace_s: float, what: str = "embedded Ray processes outlived ray.shutdown()"
) -> list[int]:
    """Wait up to `grace_s` for `pids` to end, then SIGKILL the rest (`what` they are, for the
    log); the pids killed."""
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
        log.warning("%s; killed pids %s", what, killed)
    return killed


RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # the titles Ray gives them


def reap_orphaned_ray_agents() -> list[int]:
    """Kill Ray's agents (of this user) whose raylet is gone; the pids killed. An agent is a
    raylet's child, so one with another parent has outlived its node and is only waiting."""
    orphans = set()
    for entry in Path("/proc").glob("[0-9]*"):
        argv = _argv(entry)
        if not argv or argv[0] not in RAY_AGENTS:
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # it exited meanwhile
            continue
        parent = _argv(Path("/proc") / str(ppid))
        if not (parent and Path(parent[0]).name == "raylet"):
            orphans.add(int(entry.name))
    return reap(orphans, 0.0, "Ray agents whose raylet is gone (an earlier `up` was killed)")


def _argv(entry: Path) -> list[str]:
    try:
        return (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
