"""The embedded cluster's processes end with it: those that outlive the grace period are killed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from intentserve.controller.launch.reap import child_pids, reap

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
