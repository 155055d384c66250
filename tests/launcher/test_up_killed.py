"""A SIGKILLed `intentserve up` runs no shutdown: Ray's agents of its embedded cluster outlive it
by about 60 s. The next `up` on the machine kills them before it starts Ray of its own."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from intentserve.controller.launch.reap import RAY_AGENTS

from tests.launcher.up_process import UpProcess

pytestmark = pytest.mark.integration
ONE_REPLICA = {"INTENTSERVE_SPEC__REPLICAS": "1"}


def _agents_of(temp_dir: str) -> set[int]:
    """Ray's agents holding a file of the cluster whose temp dir is `temp_dir` (their command
    line is only their title)."""
    found = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            files = (
                [os.readlink(fd) for fd in (entry / "fd").iterdir()] if title in RAY_AGENTS else []
            )
        except OSError:  # it exited meanwhile
            continue
        if any(f.startswith(temp_dir) for f in files):
            found.add(int(entry.name))
    return found


def _wait_for(up: UpProcess, pattern: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, up.stdout):
        if time.monotonic() > deadline or up.proc.poll() is not None:
            pytest.fail(f"no {pattern!r}\n{up.describe()}")
        time.sleep(0.2)


def test_a_second_up_kills_the_agents_a_killed_one_left(tmp_path):
    first = UpProcess("deploy/local.yaml", tmp_path, **ONE_REPLICA)
    try:
        _wait_for(first, r"workers: 1 actors created", 120)
        deadline = time.monotonic() + 30
        while not (agents := _agents_of(first.temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agents, "the embedded cluster started no agent to leave behind"
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        killed_s = time.monotonic()
    finally:
        first.stop()
    (tmp_path / "second").mkdir()
    second = UpProcess("deploy/local.yaml", tmp_path / "second", **ONE_REPLICA)
    try:
        _wait_for(second, r"ray: embedded Ray cluster", 120)
        assert time.monotonic() - killed_s < 50  # they would have lived ~60 s
        assert not any(Path(f"/proc/{pid}").exists() for pid in agents)
        assert "Ray agents whose raylet is gone" in second.stderr
    finally:
        second.stop()
