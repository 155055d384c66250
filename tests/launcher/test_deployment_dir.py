"""The deployment's state directory: one live `up` per deployment (a killed one lets go at once),
the record it leaves, and the CA kept across `up` processes until the deployment is stopped."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from intentserve.controller.launch.deployment_dir import DeploymentDir, DeploymentRunning, UpRecord

RECORD = UpRecord(4242, "127.0.0.1:50051", 40123, "127.0.0.1:6379")
# Another process that claims the deployment, records itself and waits to be killed.
CLAIMER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from intentserve.controller.launch.deployment_dir import DeploymentDir, UpRecord
    state = DeploymentDir(Path(sys.argv[1]), "local")
    state.claim()
    state.record(UpRecord(os.getpid(), "127.0.0.1:50051", 40123, None))
    print("claimed", flush=True)
    time.sleep(600)
    """
)


def test_a_second_claim_is_refused_naming_the_running_up_and_how_to_stop_it(tmp_path):
    first = DeploymentDir(tmp_path, "local")
    assert first.claim() is None
    with pytest.raises(DeploymentRunning, match="another `intentserve up` is starting it"):
        DeploymentDir(tmp_path, "local").claim()
    first.record(RECORD)
    with pytest.raises(DeploymentRunning) as refused:
        DeploymentDir(tmp_path, "local").claim()
    message = str(refused.value)
    assert message.startswith("deployment 'local' is already running: `intentserve up` pid 4242")
    assert "`intentserve down --controller 127.0.0.1:50051`" in message
    assert DeploymentDir(tmp_path, "other").claim() is None  # another deployment is free
    first.unlock()
    assert DeploymentDir(tmp_path, "local").claim() == RECORD  # what the first one left


def test_a_killed_up_lets_go_at_once_and_leaves_its_record(tmp_path):
    claimer = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert claimer.stdout.readline() == "claimed\n"
        with pytest.raises(DeploymentRunning, match=f"pid {claimer.pid} "):
            DeploymentDir(tmp_path, "local").claim()
    finally:
        claimer.send_signal(signal.SIGKILL)
        claimer.wait(10)
    previous = DeploymentDir(tmp_path, "local").claim()
    assert previous == UpRecord(claimer.pid, "127.0.0.1:50051", 40123, None)


def test_the_ca_is_kept_owner_only_until_the_deployment_is_removed(tmp_path):
    state = DeploymentDir(tmp_path, "local")
    state.path.mkdir(parents=True, mode=0o755)  # left open by someone else
    state.claim()
    ca = state.ca()
    assert state.ca().cert_pem == ca.cert_pem  # the next `up` signs with the same CA
    assert os.stat(state.path).st_mode & 0o777 == 0o700
    assert os.stat(state.path / "ca.key").st_mode & 0o777 == 0o600
    state.remove()
    assert not state.path.exists()
    again = DeploymentDir(tmp_path, "local")
    assert again.claim() is None
    assert again.ca().cert_pem != ca.cert_pem


def test_an_expired_kept_ca_is_replaced(tmp_path):
    state = DeploymentDir(tmp_path, "local")
    state.claim()
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)
    old = state.ca(now=long_ago)
    assert state.ca().cert_pem != old.cert_pem


def test_a_damaged_kept_ca_is_named(tmp_path):
    state = DeploymentDir(tmp_path, "local")
    state.claim()
    state.ca()
    (state.path / "ca.key").write_text("not a key")
    with pytest.raises(ValueError, match="the deployment's kept CA key .*ca.key"):
        state.ca()
