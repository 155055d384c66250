"""The embedded cluster's processes end with it: those that outlive the grace period are killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from intentserve.controller.launch.reap import child_pids, reap, reap_orphaned_ray_agents

pytestmark = pytest.mark.integration  # starts subprocesses


def test_children_are_found_and_a_process_that_will_not_end_is_killed():
    stubborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stubborn.pid in child_pids()
        assert reap({stubborn.pid}, grace_s=0.3) == [stubborn.pid]
        assert stubborn.wait(5) == -9  # SIGKILL
    finally:
        stubborn.kill()


def test_a_process_that_ends_within_the_grace_period_is_left_alone():
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    quick.wait(10)
    assert reap({quick.pid}, grace_s=0.3) == []


AGENT = "import time; time.sleep(60)"
# A stand-in raylet: starts an agent as its child, says its pid, and lives on.
RAYLET = f"""
import subprocess, time
agent = subprocess.Popen(["ray::RuntimeEnvAgent", "-c", {AGENT!r}], executable={sys.executable!r})
print(agent.pid, flush=True)
time.sleep(60)
"""


def test_ray_agents_whose_raylet_is_gone_are_killed_and_no_other_process():
    """What a SIGKILLed `up` leaves: Ray's agents outlive their raylet by about 60 s (they try to
    tell the dead GCS). The next `up` kills them; an agent whose raylet lives is left alone."""
    orphan = subprocess.Popen(["ray::DashboardAgent", "-c", AGENT], executable=sys.executable)
    raylet = subprocess.Popen(
        ["raylet", "-c", RAYLET],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        text=True,
    )
    bystander = subprocess.Popen([sys.executable, "-c", AGENT])
    served = int(raylet.stdout.readline())
    try:
        # NOTE: `in`: another deployment's killed `up` on this machine may have left some too.
        assert orphan.pid in reap_orphaned_ray_agents()
        assert orphan.wait(5) == -9
        assert raylet.poll() is None and bystander.poll() is None
        assert Path(f"/proc/{served}").exists()
    finally:
        os.kill(served, signal.SIGKILL)
        for process in (orphan, raylet, bystander):
            process.kill()
